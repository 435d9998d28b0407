"""`cache fix` repairs only what has the layout Inductor and Triton write (cache/layout.py) and
refuses a root whose top holds anything else. A project named as a cache, holding none of the
project markers the refusal once looked for, had its files moved into quarantine with PASS. Real
caches, made by a real torch.compile and a real triton.compile in child processes, still have their
corrupt entries quarantined, and only those."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from dflashdoctor.cache import quarantine
from dflashdoctor.cache.inductor_scan import held_by_a_writer, scan_inductor
from dflashdoctor.cache.layout import inductor_lock, not_a_cache
from tests import cache_tree
from tests.conftest import run_cli, run_cli_here


def _project(folder: Path) -> None:
    """The project from the report: a package, a draft with a syntax error, a settings file."""
    (folder / "pkg").mkdir(parents=True)
    (folder / "pkg" / "__init__.py").write_text("")
    (folder / "pkg" / "bad.py").write_text("def unfinished(:\n")
    (folder / "settings.json").write_text('{"lr": 0.001}\n')


def _moved(run) -> set[str]:
    return {o["original"] for f in run.findings("cache-quarantined") for o in f["evidence"]["outcomes"]}


def test_fix_refuses_a_project_with_no_marker_given_as_the_inductor_root(tmp_path):
    project = tmp_path / "P"
    _project(project)
    before = cache_tree.snapshot(project)
    run = run_cli(tmp_path, "cache", "fix", "--inductor-dir", str(project))
    assert run.code == 1, run.stdout + run.stderr
    (refused,) = run.findings("cache-quarantine-refused")
    assert refused["where"]["file"] == str(project)
    assert "its top holds pkg, settings.json" in refused["title"] and "not a cache root" in refused["title"]
    assert not run.findings("cache-quarantined")
    assert cache_tree.snapshot(project) == before and not quarantine.home_of(project).exists()


@pytest.mark.parametrize("kernel", ["none", "broken"])
def test_fix_moves_nothing_out_of_a_project_given_as_the_triton_root(tmp_path, kernel):
    """`--triton-dir .` (or TRITON_CACHE_DIR= ) in a project: triton writes its key folders among the
    project's files. Even a broken one is not moved out of a folder that is not a cache."""
    project = tmp_path / "P"
    _project(project)
    if kernel == "broken":
        cache_tree.truncate_binary(cache_tree.write_kernel(project, "k"))
    before = cache_tree.snapshot(project)
    run = run_cli_here(tmp_path, "cache", "fix", "--triton-dir", str(project))
    assert cache_tree.snapshot(project) == before and not quarantine.home_of(project).exists()
    assert not run.findings("cache-quarantined")
    if kernel == "broken":
        assert run.code == 1, run.stdout
        (refused,) = run.findings("cache-quarantine-refused")
        assert "its top holds pkg, settings.json" in refused["title"], refused["title"]
        assert len(run.findings("cache-corrupt-entry")) == 1  # still reported: only not moved
    else:
        assert run.code == 0, run.stdout  # nothing of triton's here: nothing to repair


_COMPILE = """
import torch
f = torch.compile(lambda x: (x.sin() * 2).cos().sum())
f(torch.randn(64))
layer = torch.compile(torch.nn.Linear(4, 4))
layer(torch.randn(2, 4, requires_grad=True)).sum().backward()
"""


def test_fix_quarantines_the_corrupt_entries_of_a_real_inductor_cache_and_nothing_else(tmp_path):
    """What torch really writes passes the layout (fix would refuse the root otherwise), each corrupt
    real entry is moved, and files of other names in the root's folders are left where they are."""
    root = tmp_path / "inductor"
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(root)}
    done = subprocess.run([sys.executable, "-c", _COMPILE], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert not_a_cache(root) is None, sorted(p.name for p in root.iterdir())
    generated = next(root.glob("??/*.py"))
    generated.write_text(generated.read_text() + "\ndef broken(:\n")
    graph = next(p for p in (root / "fxgraph").rglob("*") if p.is_file())
    graph.write_bytes(b"")
    autograd = next(p for p in (root / "aotautograd").rglob("*") if p.is_file())
    autograd.write_bytes(b"")
    draft = generated.parent / "draft.py"  # no name Inductor writes: not its entry, though it does not compile
    draft.write_text("def unfinished(:\n")
    (root / "dynamo").mkdir(exist_ok=True)
    (root / "dynamo" / "notes.json").write_text("{not json")
    before = cache_tree.snapshot(root)
    run = run_cli_here(tmp_path, "cache", "fix", "--inductor-dir", str(root))
    assert run.code == 0, run.stdout
    assert _moved(run) == {str(generated), str(graph.parent), str(autograd.parent)}
    assert draft.read_text() == "def unfinished(:\n" and (root / "dynamo" / "notes.json").is_file()
    (scan,) = [r for r in run.report["results"][0]["measurements"]["roots"] if r["path"] == str(root)]
    assert any(n.startswith(f"{draft}: not a cache entry") for n in scan["notes"]), scan["notes"]
    again = run_cli_here(tmp_path, "cache", "check", "--inductor-dir", str(root))
    assert again.code == 0 and not again.findings("cache-corrupt-entry"), again.stdout
    assert run_cli_here(tmp_path, "cache", "restore", "--inductor-dir", str(root)).code == 0
    assert cache_tree.snapshot(root) == before


# several C++ kernels: each `.so` is g++'s own output, written in place under torch's lock
_COMPILE_KERNELS = """
import torch
for op in (torch.sin, torch.cos, torch.tanh, torch.exp, torch.sigmoid, torch.erf):
    torch.compile(lambda x, op=op: (op(x) * 3 + x).sum(dim=-1))(torch.randn(64, 64))
"""


def test_a_kernel_being_compiled_is_not_called_broken_and_fix_leaves_it(tmp_path):
    """A check or fix beside another job's compile (a shared node's one cache) called every C++
    kernel being built "empty file" or "not an ELF binary": torch lets the compiler write `<key>.so`
    in place while it holds `locks/<key>.lock`. Scans during a real compile, and fixes started over
    and over beside it, find nothing to repair; the scans did meet kernels half written (their notes),
    the compile ends well, and afterwards the root is whole."""
    root = tmp_path / "inductor"
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(root)}
    child = subprocess.Popen([sys.executable, "-c", _COMPILE_KERNELS], env=env, stderr=subprocess.PIPE, text=True)
    fixes: list[int] = []

    def fix_while_compiling() -> None:
        while child.poll() is None:
            if (root / "locks").is_dir():  # torch has begun writing its kernels
                fixes.append(run_cli(tmp_path, "cache", "fix", "--inductor-dir", str(root), "--json").code)
            time.sleep(0.01)

    fixing = threading.Thread(target=fix_while_compiling)
    fixing.start()
    problems, in_progress = [], set()
    while child.poll() is None:
        if root.is_dir():
            scan = scan_inductor(root, "test")
            problems += [(p.entry, p.reason) for p in scan.problems]
            in_progress |= {n.split(":")[0] for n in scan.notes if "being written by a compile" in n}
        time.sleep(0.005)
    fixing.join(timeout=120)
    assert child.wait() == 0, child.stderr.read() if child.stderr else ""
    assert problems == [], problems
    assert in_progress and all(p.endswith(".so") for p in in_progress), in_progress
    assert fixes and set(fixes) == {0}, fixes
    assert not quarantine.home_of(root).exists()
    assert scan_inductor(root, "test").problems == []


def test_only_a_lock_the_entry_s_owner_holds_counts(tmp_path):
    """The lock test: torch's own FileLock held by another process counts, released it does not;
    a link or a FIFO at the lock's path is never followed or blocked on; a lock file of another owner
    than the entry's does not hide the entry."""
    shard = tmp_path / "ab"
    shard.mkdir()
    entry = shard / ("c" + "ab" + "a" * 49 + ".main.so")
    entry.write_bytes(b"")
    lock = inductor_lock(str(tmp_path), str(entry))
    assert lock == str(tmp_path / "locks" / ("cab" + "a" * 49 + ".lock"))
    assert inductor_lock(str(tmp_path), str(tmp_path / "zz" / entry.name)) is None  # not its shard
    (tmp_path / "locks").mkdir()
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from torch.utils._filelock import FileLock\n"
            "with FileLock(sys.argv[1]):\n    print('held', flush=True); sys.stdin.read()",
            lock,
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None and holder.stdout.readline() == "held\n"
    owner = entry.stat().st_uid
    assert held_by_a_writer(lock, owner)
    assert not held_by_a_writer(lock, owner + 1)
    holder.communicate("", timeout=60)
    assert not held_by_a_writer(lock, owner)
    os.unlink(lock)
    os.mkfifo(lock)
    assert not held_by_a_writer(lock, owner)  # returns at once: nothing waits for a writer
    os.unlink(lock)
    os.symlink(tmp_path / "elsewhere.lock", lock)
    assert not held_by_a_writer(lock, owner)
    assert not held_by_a_writer(str(tmp_path / "locks" / "missing.lock"), owner)


def test_an_empty_entry_folder_is_broken_only_once_it_is_no_longer_fresh(tmp_path):
    """torch makes an fxgraph entry's folder, then writes its file into it (seen empty beside a real
    compile): a folder made a moment ago is a note; one left empty for an hour is a broken entry."""
    key = "f" + "ab" + "c" * 49
    folder = tmp_path / "fxgraph" / "ab" / key
    folder.mkdir(parents=True)
    fresh = scan_inductor(tmp_path, "test")
    assert fresh.problems == [] and any(n.startswith(f"{folder}: an entry folder made") for n in fresh.notes)
    an_hour_ago = time.time() - 3600
    os.utime(folder, (an_hour_ago, an_hour_ago))
    (old,) = scan_inductor(tmp_path, "test").problems
    assert (old.kind, old.entry, old.reason) == ("corrupt", str(folder), "empty cache entry folder")


_KERNELS = """
import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource


@triton.jit
def add(x, y, out, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out + i, tl.load(x + i, mask=i < n) + tl.load(y + i, mask=i < n), mask=i < n)


@triton.jit
def scale(x, out, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out + i, tl.load(x + i, mask=i < n) * 2, mask=i < n)


pointers = {"x": "*fp32", "out": "*fp32", "n": "i32"}
for kernel, signature in ((add, {**pointers, "y": "*fp32"}), (scale, pointers)):
    triton.compile(ASTSource(kernel, signature=signature, constexprs={"BLOCK": 64}), target=GPUTarget("cuda", 90, 32))
"""


def test_fix_quarantines_a_corrupt_entry_of_a_real_triton_cache_and_refuses_it_with_a_stranger(tmp_path):
    """A real cache: triton compiles for an H100 target without a GPU (its own bundled ptxas makes the
    cubin). A truncated cubin in it is moved; a file at its top that triton never writes makes fix
    refuse the root."""
    pytest.importorskip("triton")
    root = tmp_path / "triton"
    script = tmp_path / "kernels.py"
    script.write_text(_KERNELS)
    env = {**os.environ, "TRITON_CACHE_DIR": str(root)}
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    folders = sorted(p.parent for p in root.glob("*/*.cubin"))
    assert len(folders) == 2 and not_a_cache(root) is None, sorted(p.name for p in root.iterdir())
    assert run_cli_here(tmp_path, "cache", "check", "--triton-dir", str(root)).code == 0
    cache_tree.truncate_binary(folders[0])
    (root / "notes.txt").write_text("which run made these?\n")
    before = cache_tree.snapshot(root)
    refused = run_cli_here(tmp_path, "cache", "fix", "--triton-dir", str(root))
    assert refused.code == 1 and "its top holds notes.txt" in refused.findings("cache-quarantine-refused")[0]["title"]
    assert cache_tree.snapshot(root) == before
    (root / "notes.txt").unlink()
    run = run_cli_here(tmp_path, "cache", "fix", "--triton-dir", str(root))
    assert run.code == 0 and _moved(run) == {str(folders[0])}, run.stdout
    assert run_cli_here(tmp_path, "cache", "restore", "--triton-dir", str(root)).code == 0
    assert cache_tree.snapshot(root) == {k: v for k, v in before.items() if k != "notes.txt"}
