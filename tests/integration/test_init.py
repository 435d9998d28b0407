"""`init` then `gate` on three repositories built here (tests/targets/init): a SpecForge-like drafter
repository, an HF-Trainer-like script, a torchrun script, each with a faulty twin made by changing one
marked line. The config `init` prints, used as written, makes the gate pass on the healthy one and
fail on the twin, naming the fault; `--write` adds it to pyproject.toml and never writes over one.
`init` runs in this process (main_here: it scans in the doctor's own); the gate on what it printed
runs as a real child process, with torchrun."""

from __future__ import annotations

import importlib.util
import os
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from dflashdoctor.commands import init as init_command
from dflashdoctor.pyproject_table import add_table
from tests.conftest import run_cli
from tests.paths import TARGETS

REPOS = TARGETS / "init"
# repo -> (file, marked line's text, what the faulty twin has there, the code its gate fails with)
TWINS = {
    "drafter_repo": (
        "drafter/attention.py",
        "flex_attention)  # BACKEND",
        'flex_attention, backend="eager")  # BACKEND',
        "dense-forward",
    ),
    "hf_repo": (
        "train_hf.py",
        "model = model  # COMPILE",
        'model = torch.compile(model, backend="aot_eager")',
        "dense-forward",
    ),
    "torchrun_repo": ("train_ddp.py", "FAULT_RANK = -1", "FAULT_RANK = 1", "dense-forward"),
}


def _repo(tmp_path: Path, name: str, faulty: bool) -> Path:
    repo = tmp_path / name
    shutil.copytree(REPOS / name, repo)
    if faulty:
        file, healthy_text, faulty_text, _ = TWINS[name]
        source = (repo / file).read_text()
        assert healthy_text in source
        (repo / file).write_text(source.replace(healthy_text, faulty_text))
    return repo


@pytest.mark.skipif(shutil.which("torchrun") is None, reason="needs torchrun")
@pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="needs transformers")
@pytest.mark.parametrize("faulty", [False, True], ids=["healthy", "faulty"])
@pytest.mark.parametrize("name", list(TWINS))
def test_the_printed_config_used_as_written_gates_the_repository(tmp_path, main_here, name, faulty):
    repo = _repo(tmp_path, name, faulty)
    printed = main_here("init", str(repo))
    assert printed.returncode == 0 and printed.stderr == "", printed.stderr
    (repo / "dflashdoctor.toml").write_text(printed.stdout)
    result = run_cli(repo, "gate", "--json", timeout=600)
    codes = {f["code"] for f in result.findings() if f["severity"] == "error"}
    if not faulty:
        assert result.code == 0, (printed.stdout, sorted(codes), result.stderr[-2000:])
        assert any(r["probe"] == "run" for r in result.report["results"])
        return
    assert result.code == 1 and TWINS[name][3] in codes, (printed.stdout, sorted(codes), result.stderr[-2000:])


def test_what_init_infers_and_says_it_came_from(main_here):
    drafter = main_here("init", str(REPOS / "drafter_repo")).stdout
    assert 'target = "drafter/attention.py:compiled_flex"' in drafter
    assert "torch.compile(flex_attention) at drafter/attention.py:7" in drafter
    assert 'run = "python3 train.py"' in drafter
    torchrun = main_here("init", str(REPOS / "torchrun_repo")).stdout
    assert 'run = "torchrun --standalone --nproc-per-node 2 train_ddp.py"' in torchrun
    hf = main_here("init", str(REPOS / "hf_repo")).stdout
    assert 'attn_implementation="flex_attention" at train_hf.py' in hf and "\ntarget =" not in hf


def test_write_adds_the_table_and_never_writes_over_one(tmp_path, main_here):
    repo = _repo(tmp_path, "drafter_repo", faulty=False)
    (repo / "pyproject.toml").write_text('[project]\nname = "drafter"\n')
    first = main_here("init", str(repo), "--write")
    assert first.returncode == 0, first.stderr
    text = (repo / "pyproject.toml").read_text()
    assert text.startswith('[project]\nname = "drafter"\n') and "[tool.dflashdoctor]" in text
    second = main_here("init", str(repo), "--write")
    assert second.returncode == 2 and "already has [tool.dflashdoctor]" in second.stderr
    assert (repo / "pyproject.toml").read_text() == text


def test_a_root_that_is_not_a_folder_is_one_line_and_exit_2(tmp_path, main_here):
    done = main_here("init", str(tmp_path / "nowhere"))
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1 and "is not a folder" in done.stderr


_POOL = "import torch\nfrom concurrent.futures import ThreadPoolExecutor\n\npool = ThreadPoolExecutor(2)\n"


def test_threads_and_launch_scripts_are_said_with_their_lines(tmp_path, main_here):
    """A pool that runs no model is no race (an async checkpointer, a loader's scan); one whose
    function calls the model is, and nn.DataParallel is (its replicas run in threads)."""
    (tmp_path / "pairs.py").write_text(_POOL + "pool.submit(shutil.copy, 'a', 'b')\n")
    (tmp_path / "launch.sh").write_text("#!/bin/sh\nNCCL_DEBUG=WARN torchrun --nproc-per-node 8 train.py\n")
    (tmp_path / "notes.py").write_text("# a comment naming ThreadPoolExecutor( in a file without torch\n")
    said = main_here("init", str(tmp_path)).stdout
    assert "threaded_autotuners = false  # no thread in the team's code runs a model or kernel step" in said
    assert 'run = "torchrun --nproc-per-node 8 train.py"  # launch.sh:2: torchrun launches train.py' in said
    assert "notes.py" not in said
    (tmp_path / "pairs.py").write_text(
        _POOL + "def step(pair):\n    pair.model(pair.batch).sum().backward()\npool.map(step, [])\n"
    )
    said = main_here("init", str(tmp_path)).stdout
    assert "threaded_autotuners = true  # pairs.py:7: ThreadPoolExecutor.map runs step" in said
    (tmp_path / "pairs.py").write_text("import torch\nmodel = torch.nn.DataParallel(net)\n")
    said = main_here("init", str(tmp_path)).stdout
    assert "threaded_autotuners = true  # pairs.py:2: nn.DataParallel" in said


def test_what_the_fast_scan_skips_and_still_says(tmp_path, main_here):
    """The scan reads each file once and asks it for a trigger word before any pattern: a file that
    cannot be parsed still says its words, launch scripts are found in folders skipped for Python,
    and a trainer's process group is seen (torchrun)."""
    (tmp_path / "__pycache__").mkdir()
    (tmp_path / "__pycache__" / "launch.sh").write_text("#!/bin/sh\ntorchrun --nproc-per-node 2 train.py\n")
    (tmp_path / "cached.egg-info").mkdir()
    (tmp_path / "cached.egg-info" / "pairs.py").write_text("import torch\nimport threading\nthreading.Thread()\n")
    (tmp_path / "broken.py").write_text(
        "import torch\nfrom torch.nn.attention.flex_attention import flex_attention\n"
        'model = load(attn_implementation="flex_attention")\ndef (:\n'
    )
    (tmp_path / "train.py").write_text(
        "import torch\nimport torch.distributed as dist\n\n"
        'if __name__ == "__main__":\n    dist.init_process_group("gloo")\n    loss.backward()\n'
    )
    said = main_here("init", str(tmp_path)).stdout
    assert 'attn_implementation="flex_attention" at broken.py:3' in said
    assert 'run = "torchrun --nproc-per-node 2 train.py"  # __pycache__/launch.sh:2: torchrun launches' in said
    assert "threaded_autotuners = false" in said  # egg-info holds no team code


# --- `--write` where a repository's names and another local user are hostile (issue 42) ---

FLEX_WRAPPER = (
    "import torch\nfrom torch.nn.attention.flex_attention import flex_attention\n\nfa = torch.compile(flex_attention)\n"
)


def _table(repo: Path) -> dict:
    return tomllib.loads((repo / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["dflashdoctor"]


def test_a_file_name_holding_a_newline_becomes_no_key(tmp_path, main_here):
    """`x\\nrun = "touch pwned"\\n#.py` that compiles flex_attention: init's output used to parse to
    `run = "touch pwned"`, which the gate then runs."""
    (tmp_path / 'x\nrun = "touch pwned"\n#.py').write_text(FLEX_WRAPPER)
    printed = main_here("init", str(tmp_path))
    assert printed.returncode == 0, printed.stderr
    table = tomllib.loads(printed.stdout)["tool"]["dflashdoctor"]
    assert "run" not in table and table["target"] == 'x\nrun = "touch pwned"\n#.py:fa'
    written = main_here("init", str(tmp_path), "--write")
    assert written.returncode == 0, written.stderr
    assert _table(tmp_path) == table


def test_escape_sequences_in_names_and_launch_lines_leave_pyproject_parseable(tmp_path, main_here):
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "team"  # keep this comment\n')
    (tmp_path / "a\x1b[31m.py").write_text(FLEX_WRAPPER)
    (tmp_path / "launch\x1b].sh").write_text("#!/bin/sh\ntorchrun --nproc-per-node 2 tr\x1b[2Jain.py \x07\r\n")
    done = main_here("init", str(tmp_path), "--write")
    assert done.returncode == 0, done.stderr
    text = (tmp_path / "pyproject.toml").read_text(encoding="utf-8")
    assert text.startswith('[project]\nname = "team"  # keep this comment\n')
    assert "\x1b" not in text and "\x07" not in text and "\r" not in text
    assert _table(tmp_path)["target"] == "a\x1b[31m.py:fa"


def test_a_name_that_is_not_utf8_is_a_comment_and_write_still_works(tmp_path, main_here):
    """A non-UTF-8 name crashed --write (exit 3) after pyproject.toml was created empty."""
    folder = os.fsencode(tmp_path)
    with open(folder + b"/lat\xe9n.py", "w") as handle:
        handle.write(FLEX_WRAPPER)
    done = main_here("init", str(tmp_path), "--write")
    assert done.returncode == 0, done.stderr
    text = (tmp_path / "pyproject.toml").read_text(encoding="utf-8")
    assert "lat\\xe9n.py:fa" in text and "TOML cannot hold" in text
    assert "target" not in _table(tmp_path)


@pytest.mark.parametrize(
    ("old", "said"),
    [
        ("tool = 5\n", "its `tool` is not a table"),
        ("tool = { ruff = { line-length = 100 } }\n", "with the table added is not valid TOML"),
        ("[tool\n", "is not valid TOML"),
    ],
    ids=["tool-is-a-number", "tool-inline", "not-toml"],
)
def test_a_pyproject_the_table_cannot_follow_is_left_as_it_was(tmp_path, main_here, old, said):
    (tmp_path / "pyproject.toml").write_text(old)
    (tmp_path / "attn.py").write_text(FLEX_WRAPPER)
    done = main_here("init", str(tmp_path), "--write")
    assert done.returncode == 2 and said in done.stderr and len(done.stderr.splitlines()) == 1, done.stderr
    assert (tmp_path / "pyproject.toml").read_text() == old
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


def test_a_read_only_or_immutable_pyproject_is_refused_not_replaced(tmp_path, main_here):
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text('[project]\nname = "x"\n')
    pyproject.chmod(0o444)
    done = main_here("init", str(tmp_path), "--write")
    assert done.returncode == 2 and "is read-only (mode 444)" in done.stderr, done.stderr
    pyproject.chmod(0o644)
    if subprocess.run(["chattr", "+i", str(pyproject)], capture_output=True).returncode != 0:
        return  # this filesystem has no immutable flag
    try:
        done = main_here("init", str(tmp_path), "--write")
        assert done.returncode == 2 and "immutable" in done.stderr, done.stderr
    finally:
        subprocess.run(["chattr", "-i", str(pyproject)], check=True)
    assert pyproject.read_text() == '[project]\nname = "x"\n'


def test_write_on_a_read_only_mount_is_exit_2(tmp_path):
    """A read-only bind mount of the repository, in a mount namespace of the child's own."""
    (tmp_path / "attn.py").write_text(FLEX_WRAPPER)
    script = (
        f"mount --bind -o ro {tmp_path} {tmp_path} && exec {sys.executable} -m dflashdoctor init {tmp_path} --write"
    )
    try:
        done = subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True, text=True, timeout=120)
    except FileNotFoundError:
        pytest.skip("unshare (util-linux) is not installed")
    if "mount" in done.stderr and done.returncode != 2:
        pytest.skip(f"cannot make a read-only mount here: {done.stderr.strip()[:200]}")
    assert done.returncode == 2 and "Read-only file system" in done.stderr, done.stderr
    assert not (tmp_path / "pyproject.toml").exists()


def test_the_folder_is_scanned_and_written_through_one_descriptor(tmp_path):
    """`init DIR --write` scans for seconds, then writes: swapping DIR for a link to another project
    in between made root add its table to that project. Here the swap is made right after DIR is
    opened: the scan and the write still see the folder that was opened, never the link."""
    repo, victim = tmp_path / "repo", tmp_path / "victim"
    repo.mkdir()
    victim.mkdir()
    (repo / "attn.py").write_text(FLEX_WRAPPER)
    (victim / "pyproject.toml").write_text('[project]\nname = "victim"\n')
    fd = init_command._open_root(repo)
    try:
        repo.rename(tmp_path / "moved")
        repo.symlink_to(victim, target_is_directory=True)
        text = init_command.config_text(init_command.entries(*init_command.scan(fd)))
        table = tomllib.loads(text)["tool"]["dflashdoctor"]
        add_table(fd, repo / "pyproject.toml", text, table)
    finally:
        os.close(fd)
    assert (victim / "pyproject.toml").read_text() == '[project]\nname = "victim"\n'
    assert _table(tmp_path / "moved")["target"] == "attn.py:fa"


def test_write_into_another_users_folder_is_refused(tmp_path, main_here):
    if os.geteuid() != 0:
        pytest.skip("another user's folder needs root to make")
    (tmp_path / "attn.py").write_text(FLEX_WRAPPER)
    os.chown(tmp_path, 65534, 65534)
    done = main_here("init", str(tmp_path), "--write")
    assert done.returncode == 2 and "belongs to nobody (uid 65534)" in done.stderr, done.stderr
    assert not (tmp_path / "pyproject.toml").exists()


def test_a_link_in_the_repository_is_not_followed_by_the_scan(tmp_path, main_here):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret_launch.sh").write_text("#!/bin/sh\ntorchrun --nproc-per-node 2 secret_token_abc.py\n")
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "launch.sh").symlink_to(outside / "secret_launch.sh")
    (repo / "linked").symlink_to(outside, target_is_directory=True)
    said = main_here("init", str(repo)).stdout
    assert "secret_token_abc" not in said


TRAINER = 'import torch\n\nif __name__ == "__main__":\n    loss.backward()\n'


@pytest.mark.parametrize("name", ["my train.py", "-c__import__('os').system('id')#.py"], ids=["space", "option"])
def test_the_run_line_names_the_trainer_as_one_word_the_gate_splits_back(tmp_path, main_here, name):
    """`run = "python3 my train.py"` made the gate run `my`; a file named `-c...py` made it run the
    code in the name. The gate splits `run` as a shell would: it must give the file back."""
    (tmp_path / name).write_text(TRAINER)
    printed = main_here("init", str(tmp_path))
    words = shlex.split(tomllib.loads(printed.stdout)["tool"]["dflashdoctor"]["run"])
    assert words[0] == "python3" and len(words) == 2 and (tmp_path / words[1]).resolve() == (tmp_path / name)
    assert not words[1].startswith("-")


def test_secrets_in_a_launch_line_are_not_copied_into_the_table(tmp_path, main_here):
    (tmp_path / "launch.sh").write_text(
        "#!/bin/sh\nWANDB_API_KEY=abcdef0123456789 torchrun train.py --wandb-key s3cr3tvalue "
        "--password=hunter2hunter2 --db postgres://u:pa/ss@db/x\n"
    )
    said = main_here("init", str(tmp_path)).stdout
    assert "launch.sh:2: torchrun launches train.py" in said and "torchrun train.py" in said
    for secret in ("abcdef0123456789", "s3cr3tvalue", "hunter2hunter2", "pa/ss"):
        assert secret not in said, secret
