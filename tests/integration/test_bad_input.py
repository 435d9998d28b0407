"""Bad input: one clear line on stderr, exit 2, never a traceback. The refusals are the doctor's own
(cli_here, in this process); a target that misbehaves in its probe is checked through the real
`python -m dflashdoctor` as well."""

from __future__ import annotations

import pytest

from tests.paths import TARGETS

BAD = TARGETS / "bad_inputs.py"

CASES = [
    (["no_such_pkg.attention:fn"], "no module named 'no_such_pkg.attention'"),
    ([f"{TARGETS}/missing.py:fn"], "no such file"),
    (["dflashdoctor.reference.drafter:no_such_attr"], "has no attribute 'no_such_attr'"),
    ([f"{TARGETS}/syntax_error.py:attention"], "syntax error in"),
    ([f"{BAD}:NOT_CALLABLE"], "not a callable"),
    ([f"{BAD}:wrong_signature"], "does not take flex_attention's call convention"),
    (["dflashdoctor.reference.drafter"], "is not of the form"),
    (["--heads", "6", "--kv-heads", "4"], "not a multiple of --kv-heads"),
    (["--device", "cpu", "--q-len", "512", "--kv-len", "256"], "must exceed --q-len"),
    (["--dtype", "float8"], "unknown dtype 'float8'"),
    (["--device", "tpu"], "unknown device 'tpu'"),
    (["--mask", "sliding"], "unknown mask 'sliding'"),
    (["--batch", "zero"], "Invalid value for '--batch'"),
    (["--python", "/no/such/python"], "no such executable"),
]


@pytest.mark.parametrize(("args", "message"), CASES, ids=[c[1][:30] for c in CASES])
def test_bad_input_exits_2_with_one_line(cli_here, args, message):
    run = cli_here("check-compile", *args, "--vary", "0")
    assert run.code == 2, run.stdout + run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1, run.stderr
    assert message in lines[0]
    assert "Traceback" not in run.stderr


def test_cuda_where_there_is_none(cli_here):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    run = cli_here("check-compile", "--device", "cuda")
    assert run.code == 2
    assert run.stderr.strip() == "dflashdoctor: --device cuda was asked for, but torch sees no CUDA device here"


def _damaged_inputs(folder):
    """Inputs a hostile pass found ending in exit 3 ("internal error") or a crashed probe, each with
    the words its one line must hold."""
    (folder / "huge-number.json").write_text('{"schema": ' + "9" * 5000 + "}")
    (folder / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    (folder / "deep.toml").write_text("x = " + "[" * 5000 + "]" * 5000 + "\n")
    (folder / "latin1.py").write_bytes(b"print('\xff')\n")
    deep_dir = str(folder / ("x/" * 2000))
    return [
        (["show", str(folder / "huge-number.json")], "not a report dflashdoctor wrote"),
        (["show", str(folder / "deep.json")], "not a report dflashdoctor wrote"),
        (["gate", "--config", str(folder / "deep.toml")], "nest too deep"),
        (["trace-attention", "--script", str(folder / "latin1.py")], "is not Python"),
        (["env", "--python", "/bin/false"], "not a Python 3 interpreter"),
        (["cache", "check", "--triton-dir", str(folder), "--report-dir", deep_dir], "nests too deep"),
    ]


def test_damaged_input_is_exit_2_never_3(tmp_path, main_here):
    for args, words in _damaged_inputs(tmp_path):
        done = main_here(*args)  # in tmp_path, nothing added to the arguments
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 2 and len(lines) == 1 and words in lines[0], (args[:2], done.stderr[-500:])


def test_a_target_that_returns_none_exits_or_raises_ctrl_c_is_target_raised(tmp_path):
    """The target's own behaviour is a finding about it (exit 1), not a crashed probe (exit 3); an
    import that exits is a failed import (exit 2, as one that raises)."""
    import json
    import subprocess
    import sys

    (tmp_path / "targets.py").write_text(
        "import sys\n"
        "def returns_none(q, k, v, block_mask=None, enable_gqa=False):\n    return None\n"
        "def exits(q, k, v, block_mask=None, enable_gqa=False):\n    sys.exit(4)\n"
        "def interrupts(q, k, v, block_mask=None, enable_gqa=False):\n    raise KeyboardInterrupt\n"
    )
    (tmp_path / "exits_at_import.py").write_text("import sys\nsys.exit(5)\n")
    for attr, raised in (("returns_none", "TypeError"), ("exits", "SystemExit"), ("interrupts", "KeyboardInterrupt")):
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "dflashdoctor",
                "check-compile",
                f"targets.py:{attr}",
                "--device",
                "cpu",
                "--vary",
                "0",
                "--json",
            ],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            timeout=300,
        )
        assert done.returncode == 1, done.stderr[-1000:]
        found = [f for r in json.loads(done.stdout)["results"] for f in r["findings"]]
        assert [f["title"] for f in found if f["code"] == "target-raised"] == [
            f"The target raised {raised} in phase target:first"
        ]
    done = subprocess.run(
        [sys.executable, "-m", "dflashdoctor", "check-compile", "exits_at_import.py:fn", "--device", "cpu"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
    )
    assert done.returncode == 2 and "failed: SystemExit: 5" in done.stderr and done.stderr.count("\n") == 1
