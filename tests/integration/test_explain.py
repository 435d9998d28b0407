"""`dflashdoctor explain` as a user runs it on a crashed run's log, in a real child process: a
corpus log through stdin and as a file, its report in every format, and hostile input (binary, a
100 MB line without a newline, NUL bytes, 10,000 chained exceptions, an ANSI escape bomb, a FIFO,
a folder): exit 0, 1 or 2, never a traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.paths import ROOT

LOGS = ROOT / "tests" / "realworld" / "logs"


def _explain(*args: str, cwd, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "dflashdoctor", "explain", *args],
        input=stdin,
        capture_output=True,
        cwd=cwd,
        timeout=300,
    )


def test_a_real_log_from_stdin_and_as_a_file_says_the_class_the_frame_and_the_command(tmp_path):
    log = LOGS / "04_mamba_dataparallel_replica_nargs.log"
    piped = _explain("-", "--json", "--report-dir", str(tmp_path / "r1"), cwd=tmp_path, stdin=log.read_bytes())
    assert piped.returncode == 1 and piped.stderr == b"", piped.stderr
    (found,) = json.loads(piped.stdout)["results"][0]["findings"]
    assert found["code"] == "log-autotuner-race"
    assert found["where"]["file"].endswith("lm_gpt2/train_mamba.py") and found["where"]["line"] == 35
    assert "`dflashdoctor race --threads 2`" in found["fix"]
    named = _explain(str(log), "--report-dir", str(tmp_path / "r2"), cwd=tmp_path)
    assert named.returncode == 1 and b"log-autotuner-race" in named.stdout
    assert {p.name for p in (tmp_path / "r2").iterdir()} >= {"report.html", "report.json", "report.sarif", "junit.xml"}


def _write(path, data: bytes) -> str:
    path.write_bytes(data)
    return str(path)


@pytest.mark.parametrize(
    "make",
    [
        lambda d: _write(d / "binary.log", os.urandom(1 << 20)),
        lambda d: _write(d / "one_line.log", b"x" * (100 << 20)),
        lambda d: _write(
            d / "nul.log", b'Traceback (most recent call last):\n\x00\x00 File "a.py", line 1\x00\n' * 1000
        ),
        lambda d: _write(
            d / "chain.log",
            b'Traceback (most recent call last):\n  File "/w/t.py", line 3, in f\nValueError: x\n\n'
            b"During handling of the above exception, another exception occurred:\n\n" * 10_000,
        ),
        lambda d: _write(d / "ansi.log", b"\x1b[31m\x1b]0;title\x07\x1b[2J" * 2_000_000 + b"\n"),
    ],
    ids=["binary", "100MB-line", "nul", "10000-chained", "ansi-bomb"],
)
def test_hostile_logs_end_with_an_exit_code_never_a_traceback(tmp_path, make):
    done = _explain(make(tmp_path), "--json", "--report-dir", str(tmp_path / "r"), cwd=tmp_path)
    assert done.returncode in (0, 1), done.stderr[-2000:]
    assert b"Traceback" not in done.stderr
    json.loads(done.stdout)  # stdout is the one JSON document


def test_a_fifo_a_folder_or_a_missing_log_is_one_line_and_exit_2(tmp_path):
    os.mkfifo(tmp_path / "pipe.log")
    for name, said in (("pipe.log", b"FIFO"), (".", b"folder"), ("missing.log", b"missing.log")):
        done = _explain(name, cwd=tmp_path)
        assert done.returncode == 2 and said in done.stderr and done.stderr.count(b"\n") == 1, done.stderr


def test_a_run_whose_command_crashed_says_the_class_and_explain_from_run_reads_it_again(tmp_path):
    """The CPU flex OOM the corpus holds (log 35), run under `dflashdoctor run`: the uncaught
    exception's finding carries the class read from its traceback and the class's fix, with the
    user's line (not the doctor's own recording hook); `explain --from-run` tells the same."""
    script = LOGS / "produce" / "flex_dense_oom_cpu.py"
    report_dir = tmp_path / "run"
    ran = subprocess.run(
        [sys.executable, "-m", "dflashdoctor", "run", "--json", "--report-dir", str(report_dir), "--", sys.executable,
         str(script)],
        capture_output=True, cwd=tmp_path, timeout=600,
    )  # fmt: skip
    assert ran.returncode == 1, ran.stderr[-3000:]
    (uncaught,) = [
        f for r in json.loads(ran.stdout)["results"] for f in r["findings"] if f["code"] == "uncaught-exception"
    ]
    assert uncaught["evidence"]["log_class"] == "log-flex-dense"
    assert "flex_attention ran its unfused dense path" in uncaught["title"]
    assert f"The user's innermost frame is {script}:18 in <module>" in uncaught["detail"]
    assert f"`dflashdoctor trace-attention --script {script}`" in uncaught["fix"]
    again = _explain("--from-run", str(report_dir), "--json", "--report-dir", str(tmp_path / "r"), cwd=tmp_path)
    assert again.returncode == 1, again.stderr
    (found,) = json.loads(again.stdout)["results"][0]["findings"]
    assert found["code"] == "log-flex-dense" and found["where"]["line"] == 18
    assert "It asked for 2 GiB at once" in found["detail"]


def test_from_run_refuses_another_commands_report_and_a_log_given_with_it(tmp_path):
    log = LOGS / "04_mamba_dataparallel_replica_nargs.log"
    _explain(str(log), "--report-dir", str(tmp_path / "explained"), cwd=tmp_path)
    for args, said in (
        (["--from-run", str(tmp_path / "explained")], b"not of `run`"),
        (["--from-run", str(tmp_path / "explained"), str(log)], b"not both"),
        (["--from-run", str(tmp_path / "nowhere")], b"no such report"),
    ):
        done = _explain(*args, cwd=tmp_path)
        assert done.returncode == 2 and said in done.stderr and done.stderr.count(b"\n") == 1, done.stderr


def test_from_run_reads_a_gate_whose_training_command_crashed(tmp_path):
    """The next place a run's crash is kept: a gate with `run` set. Its report holds the run's
    recorded traceback; `explain --from-run` reads it as it reads a `run`'s."""
    script = LOGS / "produce" / "flex_dense_oom_cpu.py"
    config = f'probes = ["env"]\nrun = "{sys.executable} {script}"\nrun_steps = 50\n'  # past its OOM at step 6
    (tmp_path / "dflashdoctor.toml").write_text(config)
    gated = subprocess.run(
        [sys.executable, "-m", "dflashdoctor", "gate", "--report-dir", str(tmp_path / "gate")],
        capture_output=True, cwd=tmp_path, timeout=600,
    )  # fmt: skip
    assert gated.returncode == 1, gated.stdout[-3000:]
    again = _explain("--from-run", str(tmp_path / "gate"), "--json", "--report-dir", str(tmp_path / "r"), cwd=tmp_path)
    assert again.returncode == 1, again.stderr
    (found,) = json.loads(again.stdout)["results"][0]["findings"]
    assert found["code"] == "log-flex-dense" and found["where"]["file"] == str(script) and found["where"]["line"] == 18
