"""A doctor stopped while the user's command runs, `run` and the gate's `run` section alike: killed
with SIGKILL, its command's whole tree (a daemon in a session of its own, without the doctor's
variables, too) still ends and its temporary folders go; stopped with SIGTERM, the tree ends before
the doctor does, `run` exits 3 with a whole report and the gate 143 with none (130 for Ctrl-C), as
during its probes.
The doctor is a real `python -m dflashdoctor`, in a TMPDIR of the test's own."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.left_behind import TRAINER_WITH_DAEMON, dflashdoctor_leftovers, kill_left, read_pids, wait_gone


def _start(tmp_path: Path, *argv: str) -> tuple[subprocess.Popen[bytes], Path, Path]:
    """The doctor on the trainer, its temporary files under tmp_path/tmp, its output in files (a
    pipe would stay open as long as anything it started runs); the trainer's pid file."""
    (tmp_path / "trainer.py").write_text(TRAINER_WITH_DAEMON)
    temporary = tmp_path / "tmp"
    temporary.mkdir(mode=0o700)
    with open(tmp_path / "stdout", "wb") as out, open(tmp_path / "stderr", "wb") as err:
        doctor = subprocess.Popen(
            [sys.executable, "-m", "dflashdoctor", *argv],
            cwd=tmp_path,
            env={**os.environ, "TMPDIR": str(temporary)},
            stdout=out,
            stderr=err,
        )
    return doctor, temporary, tmp_path / "pids"


def _run(tmp_path: Path) -> tuple[subprocess.Popen[bytes], Path, Path]:
    return _start(tmp_path, "run", "--report-dir", "report", "--", sys.executable, "trainer.py", "pids")


def _gate(tmp_path: Path) -> tuple[subprocess.Popen[bytes], Path, Path]:
    (tmp_path / "dflashdoctor.toml").write_text('probes = ["env"]\nrun_timeout = 240\n')
    return _start(tmp_path, "gate", "--report-dir", "report", "--run", f"{sys.executable} trainer.py pids")


def _stopped(doctor: subprocess.Popen[bytes], sig: signal.Signals, pids_file: Path) -> tuple[list[int], str]:
    """Once the trainer and its daemon run, `sig` to the doctor; their pids and the doctor's stderr."""
    pids = read_pids(pids_file, timeout_s=300)
    doctor.send_signal(sig)
    doctor.wait(timeout=120)
    return pids, (pids_file.parent / "stderr").read_text(errors="replace")


def _kill_all(doctor: subprocess.Popen[bytes], pids_file: Path) -> None:
    if doctor.poll() is None:
        doctor.kill()
        doctor.wait()
    if pids_file.exists():
        kill_left(read_pids(pids_file), "trainer.py")
        kill_left(read_pids(pids_file), "sleep 314")


def test_run_killed_with_sigkill_takes_its_commands_tree_and_temporary_folders_along(tmp_path):
    doctor, temporary, pids_file = _run(tmp_path)
    try:
        pids, _err = _stopped(doctor, signal.SIGKILL, pids_file)
        assert wait_gone(pids) == []
        assert _gone_soon(temporary) == []
        report = tmp_path / "report" / "report.json"
        assert not report.exists() or json.loads(report.read_text())  # none at all, or a whole one
    finally:
        _kill_all(doctor, pids_file)


def test_run_stopped_by_sigterm_ends_the_tree_first_and_exits_3_with_a_whole_report(tmp_path):
    doctor, temporary, pids_file = _run(tmp_path)
    try:
        pids, err = _stopped(doctor, signal.SIGTERM, pids_file)
        assert doctor.returncode == 3, err[-3000:]
        assert wait_gone(pids, timeout_s=0) == []  # ended before the doctor did
        assert dflashdoctor_leftovers(temporary) == []
        document = json.loads((tmp_path / "report" / "report.json").read_text())
        codes = {f["code"] for r in document["results"] for f in r["findings"]}
        assert {"run-interrupted", "processes-left-running"} <= codes, codes
        (left,) = [f for r in document["results"] for f in r["findings"] if f["code"] == "processes-left-running"]
        assert left["evidence"]["left_running"] == [{"pid": pids[1], "command": "sleep 314"}]
    finally:
        _kill_all(doctor, pids_file)


def test_gate_killed_with_sigkill_during_run_takes_the_trainers_tree_and_folder_along(tmp_path):
    doctor, temporary, pids_file = _gate(tmp_path)
    try:
        pids, _err = _stopped(doctor, signal.SIGKILL, pids_file)
        assert wait_gone(pids) == []
        assert _gone_soon(temporary) == []  # no dflashdoctor-gate-run-*, no bootstrap folder
    finally:
        _kill_all(doctor, pids_file)


@pytest.mark.parametrize(
    ("sig", "code", "line"),
    [(signal.SIGTERM, 143, "dflashdoctor: stopped by SIGTERM"), (signal.SIGINT, 130, None)],
)
def test_gate_stopped_during_run_exits_as_during_its_probes(tmp_path, sig, code, line):
    doctor, temporary, pids_file = _gate(tmp_path)
    try:
        pids, err = _stopped(doctor, sig, pids_file)
        assert doctor.returncode == code, err[-3000:]
        assert line is None or err.strip().splitlines()[-1] == line  # typer ends a Ctrl-C with 130 itself
        assert wait_gone(pids, timeout_s=0) == []
        assert dflashdoctor_leftovers(temporary) == []
        assert not (tmp_path / "report" / "report.json").exists()
    finally:
        _kill_all(doctor, pids_file)


def _gone_soon(temporary: Path, timeout_s: float = 60.0) -> list[str]:
    """The doctor's folders still in `temporary` after up to `timeout_s`: what cleans up after a
    doctor killed with SIGKILL does so once the command's processes have ended."""
    deadline = time.monotonic() + timeout_s
    while (left := dflashdoctor_leftovers(temporary)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left
