"""What a command under `run` leaves behind: a background child in its process group, a daemon
that left the group (setsid) with the run's agent and one without it (not Python) are named and
stopped once the command exits, and the run does not pass; SIGHUP to the doctor stops the command as SIGTERM does."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from dflashdoctor.leftovers import running
from tests.conftest import run_cli

_LEAVES = """
import subprocess, sys
sleeper = subprocess.Popen(["sleep", "300"])
daemon = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True)
stray = subprocess.Popen(["sleep", "301"], start_new_session=True)  # no agent: found by the run's marker
open(sys.argv[1], "w").write(f"{sleeper.pid} {daemon.pid} {stray.pid}")
print("leaving them behind")
"""


def test_a_background_child_and_a_setsid_daemon_are_named_and_stopped(tmp_path):
    script, pids_file = tmp_path / "leaves.py", tmp_path / "pids"
    script.write_text(_LEAVES)
    run = run_cli(tmp_path, "run", "--", sys.executable, str(script), str(pids_file))
    sleeper, daemon, stray = map(int, pids_file.read_text().split())
    assert run.code == 1, run.stdout[-3000:] + run.stderr[-2000:]
    (left,) = run.findings("processes-left-running")
    named = {entry["pid"]: entry["command"] for entry in left["evidence"]["left_running"]}
    assert set(named) == {sleeper, daemon, stray} and named[sleeper] == "sleep 300" and named[stray] == "sleep 301"
    # stopped before the doctor ended: at most zombies now, which init reaps when it comes round to them
    assert not any(map(running, (sleeper, daemon, stray)))


def test_a_command_that_leaves_nothing_has_no_such_finding(tmp_path):
    run = run_cli(tmp_path, "run", "--", sys.executable, "-c", "print('done')")
    assert run.code == 0 and not run.findings("processes-left-running"), run.stdout[-2000:]


def test_sighup_to_the_doctor_stops_the_command_and_keeps_the_report(tmp_path):
    report = tmp_path / "report"
    pid_file = tmp_path / "pid"
    program = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(300)"
    doctor = subprocess.Popen(
        [sys.executable, "-m", "dflashdoctor", "run", "--report-dir", str(report), "--", sys.executable, "-c", program],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 60
    while not pid_file.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    command = int(pid_file.read_text())
    doctor.send_signal(signal.SIGHUP)
    doctor.communicate(timeout=60)
    assert doctor.returncode == 3  # stopped before it ended: run-interrupted, as for SIGTERM
    codes = {f["code"] for r in json.loads((report / "report.json").read_text())["results"] for f in r["findings"]}
    assert "run-interrupted" in codes
    assert not running(command)
    assert Path(report / "observations.json").is_file() and os.path.getsize(report / "observations.json") > 0
