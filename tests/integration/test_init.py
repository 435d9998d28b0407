"""`init` then `gate` on three repositories built here (tests/targets/init): a SpecForge-like drafter
repository, an HF-Trainer-like script, a torchrun script, each with a faulty twin made by changing one
marked line. The config `init` prints, used as written, makes the gate pass on the healthy one and
fail on the twin, naming the fault; `--write` adds it to pyproject.toml and never writes over one.
`init` runs in this process (main_here: it scans in the doctor's own); the gate on what it printed
runs as a real child process, with torchrun."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest

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


def test_threads_and_launch_scripts_are_said_with_their_lines(tmp_path, main_here):
    (tmp_path / "pairs.py").write_text(
        "import torch\nfrom concurrent.futures import ThreadPoolExecutor\n\npool = ThreadPoolExecutor(2)\n"
    )
    (tmp_path / "launch.sh").write_text("#!/bin/sh\nNCCL_DEBUG=WARN torchrun --nproc-per-node 8 train.py\n")
    (tmp_path / "notes.py").write_text("# a comment naming ThreadPoolExecutor( in a file without torch\n")
    said = main_here("init", str(tmp_path)).stdout
    assert "threaded_autotuners = true  # a thread pool or thread at pairs.py:4" in said
    assert "# a launch line at launch.sh:2: NCCL_DEBUG=WARN torchrun --nproc-per-node 8 train.py" in said
    assert "notes.py" not in said


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
    assert "# a launch line at __pycache__/launch.sh:2: torchrun --nproc-per-node 2 train.py" in said
    assert 'run = "torchrun --standalone --nproc-per-node 2 train.py"  # train.py:4' in said
    assert "threaded_autotuners = false" in said  # egg-info holds no team code
