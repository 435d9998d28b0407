"""cache check|fix|restore on real folders: Triton trees laid out as triton writes them, a real
Inductor cache from a CPU torch.compile, each kind of damage planted and found on exactly its entry,
and fix/restore byte-identical, also after a kill -9 in the middle of a fix.

`cache` on this machine's roots scans, fixes and restores in the doctor's own process: the helper
`check` runs it in this one (run_cli_here). A real child process where the process is the point: one killed or
stopped mid-way, two at once, one under setpriv (permissions that bind root), and crafted files that
once crashed it."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from dflashdoctor.cache import manifest, quarantine
from dflashdoctor.cache.environment import mount_of
from dflashdoctor.cache.triton_scan import scan_triton
from tests import cache_tree
from tests.conftest import permissions_apply, run_cli, run_cli_here, run_main_here

EXPECTED_KIND = {name: "corrupt" for name in cache_tree.DAMAGE} | {"stray-tmp": "orphan-tmp", "no-group": "incomplete"}
CODE = {"corrupt": "cache-corrupt-entry", "orphan-tmp": "cache-orphan-tmp", "incomplete": "cache-incomplete-entry"}


def check(tmp_path: Path, *args: str, env: dict[str, str | None] | None = None):
    """`cache ARGS` in this process, in tmp_path, with run_cli's --report-dir."""
    return run_cli_here(tmp_path, "cache", *args, env=env)


def test_healthy_triton_tree_is_clean(tmp_path):
    root = tmp_path / "triton"
    cache_tree.healthy_tree(root, 12)
    run = check(tmp_path, "check", "--triton-dir", str(root))
    assert run.code == 0, run.stdout + run.stderr
    measurements = run.report["results"][0]["measurements"]
    assert measurements["entries_scanned"] == 15  # 12 kernels, an autotune-only and two driver-module folders
    assert measurements["broken_entries"] == 0
    assert run.codes() <= {"cache-low-space"}


@pytest.mark.parametrize("damage", sorted(cache_tree.DAMAGE))
def test_each_damage_is_found_on_exactly_its_entry(tmp_path, damage):
    root = tmp_path / "triton"
    folders = cache_tree.healthy_tree(root, 6)
    entry = cache_tree.DAMAGE[damage](folders[2])
    run = check(tmp_path, "check", "--triton-dir", str(root))
    kind = EXPECTED_KIND[damage]
    found = run.findings(CODE[kind])
    assert [f["where"]["file"] for f in found] == [str(entry)], run.stdout
    assert run.code == (1 if kind == "corrupt" else 0)
    others = run.codes() - {CODE[kind], "cache-low-space"}
    assert not others, others


def test_random_damage_is_always_found_and_nothing_else(tmp_path):
    """Property: any mix of the damage a crash or bad copy leaves, one kind per entry, is found on
    exactly the damaged entries, and the scan never raises."""
    chooser = random.Random(20261130)
    for plan in range(25):
        root = tmp_path / f"plan-{plan}"
        folders = cache_tree.healthy_tree(root, 10)
        damaged = chooser.sample(folders, chooser.randint(0, 6))
        expected = {}
        for folder in damaged:
            name = chooser.choice(sorted(cache_tree.DAMAGE))
            expected[str(cache_tree.DAMAGE[name](folder))] = EXPECTED_KIND[name]
        scan = scan_triton(root, "test", cache_tree.INSTALLED)
        assert {p.entry: p.kind for p in scan.problems} == expected, (plan, scan.problems)


def test_stale_entries_are_named_and_left_alone(tmp_path):
    root = tmp_path / "triton"
    cache_tree.healthy_tree(root, 3)
    old = cache_tree.write_kernel(root, "old", version="0.0.1")
    run = check(tmp_path, "fix", "--triton-dir", str(root))
    assert run.code == 0
    (stale,) = run.findings("cache-stale-entry")
    assert stale["evidence"]["entries"] == [str(old)] and "0.0.1" in stale["detail"]
    assert old.is_dir()  # another triton's entry is not broken: fix does not move it


def test_symlink_loop_inside_the_cache_is_a_finding(tmp_path):
    root = tmp_path / "triton"
    folders = cache_tree.healthy_tree(root, 2)
    os.symlink("loop-b", folders[0] / "loop-a")
    os.symlink("loop-a", folders[0] / "loop-b")
    run = check(tmp_path, "check", "--triton-dir", str(root))
    (found,) = run.findings("cache-corrupt-entry")
    assert found["where"]["file"] == str(folders[0]) and "link loop" in found["title"]


def test_a_link_in_a_triton_entry_is_named_for_what_it_leads_to(tmp_path):
    """A link to /dev/zero is a character device, not "missing"; each kind of target in its words."""
    root = tmp_path / "triton"
    folders = cache_tree.healthy_tree(root, 4)
    os.symlink("/dev/zero", folders[0] / "zero.cubin")
    os.symlink(tmp_path / "gone", folders[1] / "gone.cubin")
    os.symlink(tmp_path, folders[2] / "folder.cubin")
    os.symlink("loop.cubin", folders[3] / "loop.cubin")
    said = {p.entry: p.reason for p in scan_triton(root, "test", cache_tree.INSTALLED).problems}
    assert "symlink to /dev/zero, which is a character device" in said[str(folders[0])]
    assert "which is missing" in said[str(folders[1])]
    assert "which is a folder" in said[str(folders[2])]
    assert "which is unreachable (a link loop" in said[str(folders[3])]


def _quarantines(root: Path) -> list[Path]:
    """The quarantine folders beside `root` that hold a manifest."""
    return sorted(p.parent for p in quarantine.home_of(root).glob(f"*/{manifest.MANIFEST}"))


def _damage_several(root: Path) -> list[Path]:
    folders = cache_tree.healthy_tree(root, 20)
    return [cache_tree.DAMAGE[name](folders[i]) for i, name in enumerate(sorted(cache_tree.DAMAGE))]


def test_fix_then_restore_gives_back_the_same_bytes(tmp_path):
    root = tmp_path / "triton"
    damaged = _damage_several(root)
    before = cache_tree.snapshot(root)
    fixed = check(tmp_path, "fix", "--triton-dir", str(root))
    assert fixed.code == 0, fixed.stdout
    (moved,) = fixed.findings("cache-quarantined")
    folder = Path(moved["evidence"]["folder"])
    assert folder.parent == tmp_path / "triton.dflashdoctor-quarantine"
    assert not any(p.exists() for p in damaged)
    manifest = json.loads((folder / "manifest.json").read_text())
    assert {e["original"] for e in manifest["entries"]} == {str(p) for p in damaged}
    assert all("sha256" in f or "link" in f for e in manifest["entries"] for f in e["files"])
    assert check(tmp_path, "check", "--triton-dir", str(root)).code == 0  # healthy after the fix
    restored = check(tmp_path, "restore", "--triton-dir", str(root))
    assert restored.code == 0, restored.stdout
    assert restored.check(f"restore {folder}")["summary"] == f"{len(damaged)} restored"
    assert cache_tree.snapshot(root) == before


FIX_SLOWLY = """
import sys
from pathlib import Path
from dflashdoctor.cache.quarantine import QuarantineHome
from dflashdoctor.cache.triton_scan import scan_triton

root = Path(sys.argv[1])
problems = scan_triton(root, "test", None).problems
print("scanned", flush=True)
with QuarantineHome.open(root, create=True) as home, home.lock(60):
    home.quarantine("triton", problems)
"""


def _wait_for(condition, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.0005)


@pytest.mark.parametrize("resume", [False, True])
@pytest.mark.parametrize("kill_at", ["inventory", "manifest-written", "entries-moving"])
def test_a_fix_killed_mid_way_loses_nothing(tmp_path, resume, kill_at):
    """kill -9 at each stage of a fix over many broken entries: restoring (directly, or after a
    second fix finishes the first) gives the original tree back, byte for byte."""
    root = tmp_path / "triton"
    folders = cache_tree.healthy_tree(root, 600)
    for folder in folders[::2]:
        cache_tree.truncate_binary(folder)
    before = cache_tree.snapshot(root)
    home = tmp_path / "triton.dflashdoctor-quarantine"
    child = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(FIX_SLOWLY), str(root)], stdout=subprocess.PIPE, text=True
    )
    assert child.stdout.readline().strip() == "scanned"
    if kill_at != "inventory":
        _wait_for(lambda: any(home.glob("*/manifest.json")))
    if kill_at == "entries-moving":
        _wait_for(lambda: any(home.glob("*/entries/*")))
    child.send_signal(signal.SIGKILL)
    child.wait()
    moved = sum(1 for folder in folders[::2] if not folder.exists())
    if kill_at != "inventory":
        assert any(home.glob("*/manifest.json"))
    if resume:
        again = check(tmp_path, "fix", "--triton-dir", str(root))
        assert again.code == 0, again.stdout
        assert not any(folder.exists() for folder in folders[::2])  # the second fix finished the first
    restored = check(tmp_path, "restore", "--triton-dir", str(root))
    assert restored.code in (0, 2), restored.stderr  # 2: killed before its manifest, nothing to restore
    assert cache_tree.snapshot(root) == before, f"killed with {moved} of 300 entries moved"


@pytest.mark.parametrize("signal_number", [signal.SIGTERM, signal.SIGKILL])
def test_a_restore_stopped_mid_way_is_finished_by_the_next(tmp_path, signal_number):
    """SIGTERM or kill -9 while a restore puts 300 entries back: the next restore finishes it, and the
    tree is the original, byte for byte (no entry is lost in between: each moves with one rename)."""
    root = tmp_path / "triton"
    folders = cache_tree.healthy_tree(root, 600)
    for folder in folders[::2]:
        cache_tree.truncate_binary(folder)
    before = cache_tree.snapshot(root)
    assert check(tmp_path, "fix", "--triton-dir", str(root)).code == 0
    command = [sys.executable, "-m", "dflashdoctor", "cache", "restore", "--triton-dir", str(root), "--json"]
    child = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tmp_path)
    _wait_for(lambda: any(folder.exists() for folder in folders[::2]))
    child.send_signal(signal_number)
    child.wait()
    back = sum(1 for folder in folders[::2] if folder.exists())
    again = check(tmp_path, "restore", "--triton-dir", str(root))
    assert again.code == 0, again.stdout
    assert cache_tree.snapshot(root) == before, f"stopped with {back} of 300 entries back"


def test_real_inductor_cache_is_clean_then_each_planted_damage_is_found(tmp_path):
    cache_dir = tmp_path / "inductor"
    code = "import torch; f = torch.compile(lambda x: (x.sin() * 2).cos().sum()); f(torch.randn(64)); print('ok')"
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache_dir)}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    clean = check(tmp_path, "check", "--inductor-dir", str(cache_dir))
    assert clean.code == 0 and clean.report["results"][0]["measurements"]["entries_scanned"] > 3, clean.stdout
    generated = next(p for p in cache_dir.glob("??/*.py"))
    generated.write_text(generated.read_text()[:-40] + "\ndef broken(:\n")
    pickled = next(p for p in (cache_dir / "fxgraph").rglob("*") if p.is_file())
    pickled.write_bytes(b"")
    leftover = generated.parent / ".999999999.140000000000.tmp"
    leftover.write_text("partial")
    run = check(tmp_path, "check", "--inductor-dir", str(cache_dir))
    corrupt = {f["where"]["file"] for f in run.findings("cache-corrupt-entry")}
    assert corrupt == {str(generated), str(pickled.parent)}, run.stdout
    assert [f["where"]["file"] for f in run.findings("cache-orphan-tmp")] == [str(leftover)]
    assert run.code == 1


def test_relative_cache_variable_is_flagged(tmp_path):
    cache_tree.healthy_tree(tmp_path / "rel-cache", 1)
    env = {"TRITON_CACHE_DIR": "rel-cache", "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "i")}
    run = check(tmp_path, "check", env=env)
    (found,) = run.findings("cache-relative-path")
    assert found["evidence"]["source"] == "TRITON_CACHE_DIR"


def test_an_empty_cache_variable_is_the_current_folder_as_triton_and_torch_read_it(tmp_path):
    """triton 3.9 keeps TRITON_CACHE_DIR='' as '' and torch makes TORCHINDUCTOR_CACHE_DIR='' the current
    folder: both write their cache there. The check looks there too, and calls it relative."""
    cache_tree.healthy_tree(tmp_path / "cwd", 1)
    env = {"TRITON_CACHE_DIR": "", "TORCHINDUCTOR_CACHE_DIR": ""}
    run = run_cli_here(tmp_path / "cwd", "cache", "check", env=env)
    checked = {root["path"]: root["source"] for root in run.report["results"][0]["measurements"]["roots"]}
    assert checked == {str(tmp_path / "cwd"): "TRITON_CACHE_DIR"}  # both name that folder: checked once
    assert {f["evidence"]["source"] for f in run.findings("cache-relative-path")} == {"TRITON_CACHE_DIR"}


def test_network_filesystem_is_read_from_the_mount_table(tmp_path):
    mounts = tmp_path / "mounts"
    mounts.write_text(
        "/dev/sda1 / ext4 rw 0 0\n"
        f"server:/export {tmp_path}/shared nfs4 rw 0 0\n"
        f"tmpfs {tmp_path}/shared/local\\040dir tmpfs rw 0 0\n"
    )
    (tmp_path / "shared" / "local dir").mkdir(parents=True)
    assert mount_of(tmp_path / "shared" / "x", mounts) == (f"{tmp_path}/shared", "nfs4")
    assert mount_of(tmp_path / "shared" / "local dir", mounts) == (f"{tmp_path}/shared/local dir", "tmpfs")


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda p: p, "--triton-dir {p} does not exist"),
        (lambda p: (p.write_text("x"), p)[1], "--triton-dir {p} is a file, not a cache folder"),
        (lambda p: (os.symlink(p, p), p)[1], "--triton-dir {p}: a symbolic link loop"),
    ],
)
def test_bad_roots_exit_2_with_one_line(tmp_path, make, message):
    path = make(tmp_path / "root")
    run = check(tmp_path, "check", "--triton-dir", str(path))
    assert run.code == 2
    assert run.stderr.strip() == "dflashdoctor: " + message.format(p=path)


def test_unreadable_root_exits_2(tmp_path):
    prefix = permissions_apply(tmp_path)
    root = tmp_path / "root"
    root.mkdir(mode=0)
    run = run_cli(tmp_path, "cache", "check", "--triton-dir", str(root), prefix=prefix)
    assert run.code == 2, run.stdout + run.stderr
    assert run.stderr.strip() == f"dflashdoctor: --triton-dir {root} cannot be read by this user"


def test_unreadable_entries_are_reported_and_left_in_place(tmp_path):
    """A folder and a file this user cannot read: `cache-unreadable-entry` naming each, and `fix`
    leaves them (it could not keep a copy), creating no quarantine."""
    prefix = permissions_apply(tmp_path)
    root = tmp_path / "triton"
    entries = cache_tree.healthy_tree(root, 4)
    cubin = next(entries[1].glob("*.cubin"))
    entries[0].chmod(0)
    cubin.chmod(0)
    try:
        runs = [run_cli(tmp_path, "cache", act, "--triton-dir", str(root), prefix=prefix) for act in ("check", "fix")]
    finally:
        entries[0].chmod(0o755)
    for run in runs:
        assert run.code == 1, run.stdout + run.stderr
        found = {f["evidence"]["entry"]: f["evidence"]["files"] for f in run.findings("cache-unreadable-entry")}
        assert found == {str(entries[0]): [str(entries[0])], str(entries[1]): [str(cubin)]}
        assert not run.findings("cache-corrupt-entry")
    assert entries[0].is_dir() and cubin.is_file()
    assert not quarantine.home_of(root).exists()


def test_an_inductor_folder_that_cannot_be_listed_is_reported(tmp_path):
    prefix = permissions_apply(tmp_path)
    root = tmp_path / "inductor"
    entry = root / "fxgraph" / "ab" / "fabcdef0123"
    entry.mkdir(parents=True)
    (entry / "pickled-entry").write_bytes(b"\x80\x04N.")
    entry.chmod(0)
    try:
        run = run_cli(tmp_path, "cache", "check", "--inductor-dir", str(root), prefix=prefix)
    finally:
        entry.chmod(0o755)
    assert run.code == 1, run.stdout + run.stderr
    assert [f["evidence"]["entry"] for f in run.findings("cache-unreadable-entry")] == [str(entry)]


def test_a_move_that_fails_is_retried_by_the_next_fix_in_the_same_quarantine(tmp_path):
    prefix = permissions_apply(tmp_path)
    root = tmp_path / "triton"
    entries = cache_tree.healthy_tree(root, 3)
    cache_tree.truncate_binary(entries[0])
    entries[0].chmod(0o555)  # readable, but renaming a folder rewrites its `..`: that needs write access
    try:
        for _ in range(2):
            run = run_cli(tmp_path, "cache", "fix", "--triton-dir", str(root), prefix=prefix)
            assert run.code == 1, run.stdout + run.stderr
            assert [f["evidence"]["entry"] for f in run.findings("cache-corrupt-entry")] == [str(entries[0])]
            assert entries[0].is_dir() and len(_quarantines(root)) == 1
    finally:
        entries[0].chmod(0o755)
    run = run_cli(tmp_path, "cache", "fix", "--triton-dir", str(root), prefix=prefix)
    assert run.code == 0, run.stdout + run.stderr
    assert not entries[0].exists() and len(_quarantines(root)) == 1


def _bad_input_line(run) -> str:
    """The one line a bad input gets, after checking it is one line and exit 2."""
    assert run.code == 2 and len(run.stderr.strip().splitlines()) == 1, run.stdout + run.stderr
    return run.stderr.strip()


def test_restore_of_a_damaged_manifest_exits_2(tmp_path):
    (tmp_path / "triton").mkdir()
    folder = quarantine.home_of(tmp_path / "triton") / "20261201T000000.000000Z"
    folder.mkdir(parents=True, mode=0o700)
    (folder / "manifest.json").write_text('{"schema": "dflashdoctor.quarantine/1", "entr')
    line = _bad_input_line(check(tmp_path, "restore", str(folder)))
    assert line.startswith(f"dflashdoctor: {folder / 'manifest.json'} is not a readable quarantine manifest")


def test_restore_of_a_folder_outside_a_quarantine_exits_2(tmp_path):
    """A folder with a manifest that does not sit beside a root: its root cannot be known."""
    (tmp_path / "manifest.json").write_text("{}")
    line = _bad_input_line(check(tmp_path, "restore", str(tmp_path)))
    assert line.startswith(f"dflashdoctor: {tmp_path} is not a quarantine folder: it does not sit in a")


def test_restore_of_a_folder_without_manifest_exits_2(tmp_path):
    line = _bad_input_line(check(tmp_path, "restore", str(tmp_path)))
    assert line == f"dflashdoctor: {tmp_path} is not a quarantine folder (no manifest.json in it)"


def test_driver_modules_of_older_triton_are_healthy_and_a_lone_kernel_binary_is_not(tmp_path):
    """triton before 3.3 names its driver modules without an interpreter tag (`cuda_utils.so`); a
    kernel's own `.so` with no group file is still an interrupted compile."""
    root = tmp_path / "triton"
    cache_tree.healthy_tree(root, 2)
    for module in ("__triton_launcher", "cuda_utils"):
        _, key = cache_tree.key_for("untagged-" + module)
        (root / key).mkdir()
        (root / key / f"{module}.so").write_bytes(cache_tree.ELF)
    _, key = cache_tree.key_for("lone-kernel")
    (root / key).mkdir()
    (root / key / "kernel_0.so").write_bytes(cache_tree.ELF)
    run = check(tmp_path, "check", "--triton-dir", str(root))
    assert [f["evidence"]["entry"] for f in run.findings("cache-incomplete-entry")] == [str(root / key)]
    assert not run.findings("cache-corrupt-entry")


def test_a_root_reached_through_a_link_is_healthy(tmp_path):
    """Clusters link ~/.triton to scratch: triton wrote the group files with the real path, and the
    check runs through the link (and the other way round). Same folders, so no finding."""
    real = tmp_path / "scratch" / "c"
    cache_tree.healthy_tree(real / "triton", 5)
    link = tmp_path / "l"
    link.symlink_to(real)
    through_link = check(tmp_path, "check", "--triton-dir", str(link / "triton"))
    assert through_link.code == 0, through_link.stdout
    assert through_link.codes() <= {"cache-low-space"}
    (tmp_path / "scratch" / "d").mkdir()
    linked_writes = tmp_path / "linked-writes"
    linked_writes.symlink_to(tmp_path / "scratch" / "d")
    cache_tree.healthy_tree(linked_writes / "triton", 3)  # group files name the link's path
    direct = check(tmp_path, "check", "--triton-dir", str(tmp_path / "scratch" / "d" / "triton"))
    assert direct.code == 0 and direct.codes() <= {"cache-low-space"}, direct.stdout


def test_a_linked_root_whose_groups_point_into_another_cache_is_still_flagged(tmp_path):
    """A copied cache, reached through a link: its groups name files in the cache it was copied from,
    which exist (triton would read them from there). The folders differ, so the finding stays."""
    original = tmp_path / "scratch" / "c" / "triton"
    folders = cache_tree.healthy_tree(original, 3)
    copy = tmp_path / "scratch" / "copy" / "triton"
    shutil.copytree(original, copy)
    link = tmp_path / "l"
    link.symlink_to(copy.parent)
    run = check(tmp_path, "check", "--triton-dir", str(link / "triton"))
    assert run.code == 1
    flagged = {f["where"]["file"] for f in run.findings("cache-corrupt-entry")}
    assert flagged == {str(link / "triton" / f.name) for f in folders}
    assert all("outside this folder" in f["title"] for f in run.findings("cache-corrupt-entry"))


def test_restore_puts_back_every_open_quarantine_oldest_first(tmp_path):
    root = tmp_path / "triton"
    folders = cache_tree.healthy_tree(root, 6)
    before = cache_tree.snapshot(root)
    quarantined = []
    for folder in folders[:3]:
        saved = (folder, {p.name: p.read_bytes() for p in folder.iterdir()})
        cache_tree.truncate_binary(folder)
        fixed = check(tmp_path, "fix", "--triton-dir", str(root))
        assert fixed.code == 0, fixed.stdout
        quarantined.append(fixed.findings("cache-quarantined")[0]["evidence"]["folder"])
        saved[0].mkdir()  # as triton would rebuild it: the same files, whole
        for name, data in saved[1].items():
            (saved[0] / name).write_bytes(data)
        shutil.rmtree(saved[0])  # ...and then a user removed it again
    restored = check(tmp_path, "restore", "--triton-dir", str(root))
    assert restored.code == 0, restored.stdout
    names = [c["name"] for c in restored.report["results"][0]["checks"]]
    assert names == [f"restore {q}" for q in quarantined]
    assert len(_quarantines(root)) == 3
    changed = {p: v for p, v in cache_tree.snapshot(root).items() if before.get(p) != v}
    assert set(changed) == {str(next(f.glob("*.cubin")).relative_to(root)) for f in folders[:3]}  # the damage
    again = check(tmp_path, "restore", "--triton-dir", str(root))
    assert again.code == 0 and again.check(f"restore {quarantine.home_of(root)}")["status"] == "pass"


@pytest.mark.parametrize("trouble", ["missing", "conflict", "changed"])
def test_restore_never_passes_while_a_moved_entry_is_out_of_place(tmp_path, trouble):
    root = tmp_path / "triton"
    folders = cache_tree.healthy_tree(root, 4)
    damaged = cache_tree.truncate_binary(folders[0])
    fixed = check(tmp_path, "fix", "--triton-dir", str(root))
    folder = Path(fixed.findings("cache-quarantined")[0]["evidence"]["folder"])
    stored = folder / "entries" / damaged.name
    if trouble == "missing":
        shutil.move(stored, tmp_path / "elsewhere")
    elif trouble == "conflict":
        damaged.mkdir()
    else:
        next(stored.glob("*.ttir")).write_text("edited in quarantine\n")
    run = check(tmp_path, "restore", "--triton-dir", str(root))
    assert run.code == 1, run.stdout
    (incomplete,) = run.findings("cache-restore-incomplete")
    assert f"1 {trouble}" in incomplete["title"] and incomplete["where"]["file"] == str(damaged)
    assert run.check(f"restore {folder}")["status"] == "fail"
    assert run.report["verdict"] == "fail"


def test_two_fixes_at_once_then_one_restore_give_back_the_tree_byte_for_byte(tmp_path):
    """Two `cache fix` started together on a 20,000-entry cache with 40 broken entries, then a plain
    `cache restore`: every file back with its sha256, size and mode; neither fix reported an error
    for an entry the other had moved."""
    root = tmp_path / "triton"
    folders = cache_tree.healthy_tree(root, 20_000)
    for folder in folders[::500]:
        cache_tree.truncate_binary(folder)
    before = cache_tree.snapshot(root)
    report_dirs = [tmp_path / f"report-{i}" for i in range(2)]
    command = [sys.executable, "-m", "dflashdoctor", "cache", "fix", "--triton-dir", str(root), "--json"]
    fixes = [
        subprocess.Popen([*command, "--report-dir", str(d)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for d in report_dirs
    ]
    results = [(fix.communicate(timeout=600), fix.returncode) for fix in fixes]
    reports = [json.loads(out) for (out, _err), _code in results]
    assert [code for _, code in results] == [0, 0], [err for (_out, err), _ in results]
    moved = [
        sum(len(f["evidence"]["outcomes"]) for f in r["results"][0]["findings"] if f["code"] == "cache-quarantined")
        for r in reports
    ]
    assert sorted(moved) == [0, 40]  # one fix moved all 40; the other, after the lock, found nothing broken
    assert all(f["severity"] != "error" for r in reports for f in r["results"][0]["findings"])
    assert len(_quarantines(root)) == 1
    restored = check(tmp_path, "restore", "--triton-dir", str(root))
    assert restored.code == 0, restored.stdout
    assert cache_tree.snapshot(root) == before


def _project(folder: Path) -> list[Path]:
    """A small Python project: what a mistaken cache root points at."""
    (folder / "pkg" / "sub").mkdir(parents=True)
    files = [folder / "pyproject.toml", folder / "pkg" / "__init__.py", folder / "pkg" / "sub" / "__init__.py"]
    for path in files:
        path.write_text("")
    broken = folder / "pkg" / "draft.py"
    broken.write_text("def unfinished(:\n")
    return [*files, broken]


@pytest.mark.parametrize("how", ["--inductor-dir .", "TORCHINDUCTOR_CACHE_DIR="])
def test_fix_moves_nothing_out_of_a_project_given_as_the_cache(tmp_path, how):
    """`--inductor-dir .` or an empty TORCHINDUCTOR_CACHE_DIR in a project: the scanner calls its
    empty `__init__.py` files and a draft with a syntax error broken entries; fix moved them all."""
    project = tmp_path / "project"
    project.mkdir()
    files = _project(project)
    env = {"TORCHINDUCTOR_CACHE_DIR": ""} if how.endswith("=") else None
    # the variable's root is the environment's: --triton-dir names another, --all-roots keeps both
    args = ["--inductor-dir", "."] if env is None else ["--triton-dir", str(tmp_path / "triton"), "--all-roots"]
    (tmp_path / "triton").mkdir()
    done = run_main_here(project, ["cache", "fix", *args, "--json"], env)
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr
    report = json.loads(done.stdout)
    found = [f for r in report["results"] for f in r["findings"]]
    (refused,) = [f for f in found if f["code"] == "cache-quarantine-refused"]
    assert "pyproject.toml" in refused["title"] or "set but empty" in refused["title"], refused["title"]
    assert not [f for f in found if f["code"] == "cache-quarantined"]
    assert all(path.exists() for path in files) and not (tmp_path / "project.dflashdoctor-quarantine").exists()
    if env:
        (empty,) = [f for f in found if f["code"] == "cache-relative-path"]
        assert "TORCHINDUCTOR_CACHE_DIR is set but empty" in empty["title"]


def test_crafted_cache_files_are_broken_entries_not_a_crash(tmp_path):
    """A 5000-digit JSON number, brackets nested 100,000 deep, a 200,000-term expression, a
    5000-deep parenthesis and a temporary name with a 21-digit pid: each once ended `cache check`
    with exit 3; each is a broken (or left-over) entry."""
    key = tmp_path / "triton" / ("A" * 52)
    key.mkdir(parents=True)
    (key / "__grp__kern.json").write_text('{"child_paths": ' + "9" * 5000 + "}")
    (key / "kern.json").write_text("[" * 100_000 + "]" * 100_000)
    long_sum = cache_tree.generated_path(tmp_path / "inductor", "sum", "py")
    long_sum.write_text("x = " + "+".join(["1"] * 200_000) + "\n")
    cache_tree.generated_path(tmp_path / "inductor", "deep", "py").write_text("x = " + "(" * 5000 + ")" * 5000 + "\n")
    (long_sum.parent / ".123456789012345678901.1.tmp").write_text("x")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "dflashdoctor",
            "cache",
            "check",
            "--json",
            "--triton-dir",
            str(tmp_path / "triton"),
            "--inductor-dir",
            str(tmp_path / "inductor"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 1, done.stderr
    codes = [f["code"] for r in json.loads(done.stdout)["results"] for f in r["findings"]]
    assert codes.count("cache-corrupt-entry") >= 3 and "cache-orphan-tmp" in codes, codes


def test_the_inductor_scan_never_reads_through_a_link_or_a_fifo(tmp_path):
    """A link in a shard to a root-only file, and a FIFO named like generated code: the scan reads
    neither (before, it compiled the link's target and would block on the FIFO's open)."""
    secret = tmp_path / "secret.txt"
    secret.write_text("not python: root's own\n")
    cache_tree.generated_path(tmp_path / "inductor", "link", "py").symlink_to(secret)
    os.mkfifo(cache_tree.generated_path(tmp_path / "inductor", "fifo", "py"))
    (tmp_path / "triton").mkdir()
    roots = ["--inductor-dir", str(tmp_path / "inductor"), "--triton-dir", str(tmp_path / "triton")]
    done = run_main_here(tmp_path, ["cache", "check", "--json", *roots])
    assert done.returncode == 1, done.stderr
    titles = [f["title"] for r in json.loads(done.stdout)["results"] for f in r["findings"]]
    assert any("a symbolic link to" in t and "not followed" in t for t in titles), titles
    assert any("a FIFO, not a regular file" in t for t in titles), titles
