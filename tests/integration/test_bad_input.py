"""Bad input: one clear line on stderr, exit 2, never a traceback."""

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
def test_bad_input_exits_2_with_one_line(cli, args, message):
    run = cli("check-compile", *args, "--vary", "0")
    assert run.code == 2, run.stdout + run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1, run.stderr
    assert message in lines[0]
    assert "Traceback" not in run.stderr


def test_cuda_where_there_is_none(cli):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    run = cli("check-compile", "--device", "cuda")
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


def test_damaged_input_is_exit_2_never_3(tmp_path):
    import subprocess
    import sys

    for args, words in _damaged_inputs(tmp_path):
        done = subprocess.run(
            [sys.executable, "-m", "dflashdoctor", *args], capture_output=True, text=True, cwd=tmp_path, timeout=300
        )
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 2 and len(lines) == 1 and words in lines[0], (args[:2], done.stderr[-500:])
