"""Bad input: one clear line on stderr, exit 2, never a traceback. The refusals are the doctor's own
(cli_here, in this process); a target that misbehaves in its probe is checked through the real
`python -m dflashdoctor` as well."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import threading

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


# --- a hostile pass's inputs that ended in exit 3, a hang or the wrong code (issue 42) ---


def _huge_inputs(folder):
    """(arguments, words its one line holds) for numbers past what Python converts, and files where a
    model's config.json should be that would block or never end."""

    (folder / "timeout.toml").write_text('probes = ["env"]\ntimeout = ' + "9" * 400 + "\n")
    (folder / "vary.toml").write_text('probes = ["env"]\nvary = ' + "9" * 5000 + "\n")
    repo = folder / "repo"
    repo.mkdir()
    (repo / "pyproject.toml").write_text("x = " + "9" * 5000 + "\n")
    for kind in ("fifo", "zero"):
        (folder / kind).mkdir()
        (folder / f"model-{kind}.toml").write_text(f'probes = ["trace-attention"]\nmodel = "{folder / kind}"\n')
    os.mkfifo(folder / "fifo" / "config.json")
    (folder / "zero" / "config.json").symlink_to("/dev/zero")
    return [
        (["gate", "--config", str(folder / "timeout.toml")], "timeout must be at most"),
        (["gate", "--config", str(folder / "vary.toml")], "is not a configuration"),
        (["init", str(repo), "--write"], "cannot be read"),
        (["gate", "--config", str(folder / "model-fifo.toml")], "is a FIFO, not a regular file"),
        (["gate", "--config", str(folder / "model-zero.toml")], "is a character device, not a regular file"),
    ]


def test_huge_numbers_and_blocking_model_configs_are_exit_2(tmp_path, main_here):
    for args, words in _huge_inputs(tmp_path):
        done = main_here(*args, "--report-dir", str(tmp_path / "r")) if args[0] == "gate" else main_here(*args)
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 2 and len(lines) == 1 and words in lines[0], (args, done.stderr[-500:])


def _doctor_child(cwd, *args, **run):

    return subprocess.run([sys.executable, "-m", "dflashdoctor", *args], cwd=cwd, timeout=300, **run)


def test_closed_standard_streams_are_exit_2_not_3(tmp_path):
    """`dflashdoctor ... --json >&-` raised AttributeError (exit 3); with stderr closed a refusal
    exited 1, and the next file opened would have taken descriptor 2."""

    (tmp_path / "a.py").write_text("x = 1\n")
    closed_out = _doctor_child(
        tmp_path, "lint", "a.py", "--json", "--report-dir", "r", stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    assert closed_out.returncode == 0  # /dev/null as stdout: a normal run
    shell = (
        f"cd {tmp_path} && {{ {' '.join(_argv('lint', 'a.py', '--json', '--report-dir', 'r2'))} >&- ; echo out=$?; }}; "
        f"{' '.join(_argv('show', 'missing.json'))} 2>&- ; echo err=$?"
    )
    codes = subprocess.run(["sh", "-c", shell], capture_output=True, text=True, timeout=300)
    assert "out=2" in codes.stdout and "err=2" in codes.stdout, codes.stdout + codes.stderr
    assert "stdout is closed" in codes.stderr


def _argv(*args):

    return [shlex.quote(word) for word in (sys.executable, "-m", "dflashdoctor", *args)]


def test_a_stdout_that_cannot_encode_the_marks_shows_escapes_not_a_crash(tmp_path):
    """PYTHONIOENCODING=ascii (or LC_ALL=C without UTF-8 mode): ✘ and ✔ raised UnicodeEncodeError."""

    (tmp_path / "a.py").write_text(
        "from torch.nn.attention.flex_attention import flex_attention\nflex_attention(1, 2, 3)\n"
    )
    (tmp_path / "café.py").write_text((tmp_path / "a.py").read_text())
    env = {**os.environ, "PYTHONIOENCODING": "ascii"}
    done = _doctor_child(tmp_path, "lint", "a.py", "café.py", "--report-dir", "r", capture_output=True, env=env)
    assert done.returncode == 1 and b"Traceback" not in done.stderr, done.stderr
    assert b"caf\\xe9.py:2:1: DFD001" in done.stdout or b"caf\\u00e9.py:2:1: DFD001" in done.stdout, done.stdout
    done = _doctor_child(tmp_path, "show", "r/report.json", capture_output=True, env=env)  # the terminal's marks
    assert done.returncode == 0 and b"Traceback" not in done.stderr, done.stderr
    assert b"\\u2718" in done.stdout


def test_show_refuses_a_duration_that_is_no_number(tmp_path, main_here):

    (tmp_path / "a.py").write_text("x = 1\n")
    assert main_here("lint", "a.py", "--report-dir", "r").returncode == 0
    document = json.loads((tmp_path / "r" / "report.json").read_text())
    for where, value in (("report", float("nan")), ("section", float("inf"))):
        if where == "report":
            document["duration_s"] = value
        else:
            document["duration_s"], document["results"][0]["duration_s"] = 1.0, value
        (tmp_path / "bad.json").write_text(json.dumps(document))
        done = main_here("show", "bad.json", "--format", "junit")
        assert done.returncode == 2 and "not a finite number of seconds" in done.stderr, done.stderr


def test_a_doctor_stopped_with_a_thread_that_never_returns_still_exits(tmp_path):
    """SIGTERM left a gate running for 36 minutes: its main thread waited on a worker blocked reading
    a FIFO. Stopped, the doctor gives its threads a grace period, then ends without them."""

    script = (
        "import threading, time\n"
        "from dflashdoctor.cli import exit_process\n"
        "threading.Thread(target=time.sleep, args=(600,)).start()\n"
        "exit_process(143)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], timeout=60)
    assert done.returncode == 143


def test_main_is_a_function_of_the_command_line_it_is_given(main_here, tmp_path):
    """`cli.main(argv) -> int`, as pytest's main: the report quotes the command line given (this
    process's own sys.argv is pytest's), the exit code is returned, not raised, and the SIGTERM
    handler it sets for its run is put back."""
    from dflashdoctor import cli

    (tmp_path / "a.py").write_text("x = 1\n")
    before = signal.getsignal(signal.SIGTERM)
    done = main_here("lint", "a.py", "--report-dir", "r")
    assert done.returncode == 0 and signal.getsignal(signal.SIGTERM) is before
    assert json.loads((tmp_path / "r" / "report.json").read_text())["argv"] == [
        "dflashdoctor",
        "lint",
        "a.py",
        "--report-dir",
        "r",
    ]
    assert cli.main(["lint", "--no-such-option"]) == 2 and signal.getsignal(signal.SIGTERM) is before
    # typer ends its completion options with SystemExit (0, or 1 where it cannot name the program, as
    # under an xdist worker): returned as the code, not raised past main
    assert cli.main(["--show-completion", "bash"]) in (0, 1)
    from_a_thread: list[int] = []  # signals are the main thread's: from another, SIGTERM is left alone
    worker = threading.Thread(target=lambda: from_a_thread.append(cli.main(["lint", "--no-such-option"])))
    worker.start()
    worker.join()
    assert from_a_thread == [2] and signal.getsignal(signal.SIGTERM) is before
