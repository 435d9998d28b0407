"""Reading a repository's documented commands (lint/launches.py) and lint's globs (lint/settings.py):
the shapes real repositories write, each with what must come out."""

from __future__ import annotations

import pytest

from dflashdoctor.lint.launches import launches
from dflashdoctor.lint.settings import matches

# torchtitan's shape: the README sets a variable before the script, whose own default it overrides
TITAN = {
    "README.md": "Train:\n\n```bash\nCONFIG_FILE=./configs/debug.toml ./run_train.sh\n```\n",
    "run_train.sh": (
        '#!/usr/bin/bash\nset -ex\nNGPU=${NGPU:-"8"}\nCONFIG_FILE=${CONFIG_FILE:-"./configs/big.toml"}\n'
        'PYTORCH_ALLOC_CONF="expandable_segments:True" \\\ntorchrun --nproc_per_node=${NGPU} \\\n'
        '--rdzv_endpoint="localhost:0" -m pkg.train --job.config_file ${CONFIG_FILE} "$@"\n'
    ),
}


def _first(documents: dict[str, str], scripts: dict[str, str] | None = None):
    found = launches(documents, scripts or {})
    assert found, documents
    return found[0]


def test_a_readme_line_followed_into_its_script_with_its_variables():
    launch = _first(TITAN)
    assert (launch.file, launch.line, launch.via) == ("run_train.sh", 5, ["README.md:4"])
    assert launch.launcher == "torchrun" and launch.entry == "-m pkg.train"
    assert launch.args == ["--job.config_file", "./configs/debug.toml"]
    assert launch.command().startswith("torchrun --nproc_per_node=8 --rdzv_endpoint=localhost:0 -m pkg.train")


@pytest.mark.parametrize(
    ("documents", "launcher", "entry", "args"),
    [
        (
            {"Makefile": "train:\n\t@python3 train.py --config cfg.yaml\n"},
            "python",
            "train.py",
            ["--config", "cfg.yaml"],
        ),
        (
            {
                ".github/workflows/ci.yml": "jobs:\n  t:\n    steps:\n      - run: |\n          pip install .\n"
                "          tune run lora_finetune --config llama3/8B_lora max_steps_per_epoch=2\n"
            },
            "tune",
            "tune run lora_finetune",
            ["--config", "llama3/8B_lora", "max_steps_per_epoch=2"],
        ),
        (
            {
                "job.slurm": "#SBATCH -N 2\nsrun --ntasks-per-node=1 python -m torch.distributed.run "
                "--nproc-per-node 8 "
                "pretrain.py --cfg a.yaml\n"
            },
            "torchrun",
            "pretrain.py",
            ["--cfg", "a.yaml"],
        ),
        (
            {"README.md": "```sh\n$ accelerate launch --config_file fsdp.yaml sft.py --model x\n```\n"},
            "accelerate",
            "sft.py",
            ["--model", "x"],
        ),
        (
            {"README.md": "```console\nuv run python -m pkg.fit fit --config c.yaml\n```\n"},
            "python",
            "-m pkg.fit",
            ["fit", "--config", "c.yaml"],
        ),
    ],
)
def test_each_place_and_launcher_teams_write(documents, launcher, entry, args):
    launch = _first(documents)
    assert (launch.launcher, launch.entry, launch.args) == (launcher, entry, args)


def test_prose_non_shell_blocks_and_installs_are_not_commands():
    documents = {
        "README.md": "Run `python train.py` after setup.\n\n```python\nimport train\n```\n\n```bash\npip install -e .\n"
        "git clone x\n```\n"
    }
    assert launches(documents, {}) == []


@pytest.mark.parametrize(
    ("glob", "path", "matched"),
    [
        ("third_party/", "third_party/x/y.py", True),
        ("third_party/", "src/third_party/y.py", True),
        ("third_party/", "third_party.py", False),
        ("*_pb2.py", "proto/a_pb2.py", True),
        ("scripts/**", "scripts/debug/probe.py", True),
        ("scripts/**", "src/scripts/probe.py", False),
        ("/gen.py", "gen.py", True),
        ("/gen.py", "sub/gen.py", False),
        ("a/*.py", "a/b/c.py", False),
        ("a/**/c.py", "a/b/d/c.py", True),
    ],
)
def test_globs_read_as_gitignore_reads_them(glob, path, matched):
    assert matches(glob, path) is matched


@pytest.mark.timeout(60)  # a hang guard: each ran for hours (or out of memory) before
def test_hostile_scripts_and_globs_end():
    """What another user can put in a repository root scans: a variable that doubles sixty times, a
    .gitignore glob whose regex backtracks (`*a*a*a...b`), a thousand `**/`."""
    bomb = "A0=xx\n" + "".join(f"A{i}=$A{i - 1}$A{i - 1}\n" for i in range(1, 60)) + "python train.py --x $A59\n"
    (launch,) = launches({"run.sh": bomb}, {})
    assert len(launch.command()) < 10_000 and launch.entry == "train.py"
    assert not matches("a/" + "*a" * 200 + "b", "a/" + "a" * 300)
    assert matches("a/" + "**/" * 150 + "c", "a/x/y/c") and not matches("**/" * 1000 + "c", "c")
