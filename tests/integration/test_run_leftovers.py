"""What a command under `run` leaves behind: a background child in its process group, a daemon
that left the group (setsid) with the run's agent and one without it (not Python) are named and
stopped once the command exits, and the run does not pass; so is a daemon that dropped the run's
marker (`setsid env -i`, a program that unsets it and double-forks) or runs as another user, found by
the process tree, or by the run's own cgroup once the command killed its launcher; another user's
process that copies the marker is neither named nor stopped.
SIGHUP to the doctor stops the command as SIGTERM does."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dflashdoctor import cgroup
from dflashdoctor.agent.config import EVENTS_DIR
from dflashdoctor.leftovers import running
from tests.conftest import run_cli, start_as_nobody
from tests.left_behind import AS_ANOTHER_USER, SHELL_DAEMON, UNSETS_AND_DOUBLE_FORKS, kill_left, read_pids, wait_gone

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


@pytest.mark.parametrize("how", ["setsid env -i", "unsets the marker and double-forks"])
def test_a_daemon_without_the_runs_marker_is_found_by_the_tree_named_and_stopped(tmp_path, how):
    pids_file = tmp_path / "pids"
    if how == "setsid env -i":
        command = ["sh", "-c", SHELL_DAEMON.format(pids=pids_file)]
    else:
        script = tmp_path / "daemonizes.py"
        script.write_text(UNSETS_AND_DOUBLE_FORKS)
        command = [sys.executable, str(script), str(pids_file)]
    daemon = 0
    try:
        run = run_cli(tmp_path, "run", "--", *command)
        (daemon,) = read_pids(pids_file)
        assert run.code == 1, run.stdout[-3000:] + run.stderr[-2000:]
        (left,) = run.findings("processes-left-running")
        sleeps = "sleep 311" if how == "setsid env -i" else "sleep 312"
        assert left["evidence"]["left_running"] == [{"pid": daemon, "command": sleeps}]
        assert not running(daemon)  # stopped before the doctor ended
    finally:
        kill_left([daemon], "sleep 31")


def test_a_descendant_running_as_another_user_is_named_and_stopped_by_root(tmp_path):
    """The trainer drops privileges for a daemon (setpriv to nobody, its own session, an empty
    environment): no marker could find it, and no marker of another user's is believed. The process
    tree proves it is the run's own, so root names it and stops it."""
    if os.geteuid() != 0:
        pytest.skip("starting a process as another user needs root")
    pids_file = tmp_path / "pids"
    daemon = 0
    try:
        run = run_cli(tmp_path, "run", "--", "sh", "-c", AS_ANOTHER_USER.format(pids=pids_file))
        (daemon,) = read_pids(pids_file)
        assert run.code == 1, run.stdout[-3000:] + run.stderr[-2000:]
        (left,) = run.findings("processes-left-running")
        assert left["evidence"]["left_running"] == [{"pid": daemon, "command": "sleep 313"}]
        assert not wait_gone([daemon], timeout_s=0)
    finally:
        kill_left([daemon], "sleep 313")


def test_another_users_process_carrying_the_runs_marker_is_neither_named_nor_stopped(tmp_path):
    """The run's marker names its events folder, which another user can guess: a process of theirs
    that carries it before the run even starts is not the run's, and root leaves it alone."""
    events = (tmp_path / "report" / "events").resolve()
    intruder = start_as_nobody(["sleep", "315"], {"PATH": os.environ["PATH"], EVENTS_DIR: str(events)})
    try:
        run = run_cli(tmp_path, "run", "--", sys.executable, "-c", "print('done')")
        assert run.code == 0 and not run.findings("processes-left-running"), run.stdout[-2000:]
        assert intruder.poll() is None
    finally:
        intruder.kill()
        intruder.wait()


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


_KILLS_ITS_LAUNCHER = """
(setsid env -i sleep 319 & echo $! > "$1.tmp"; mv "$1.tmp" "$1")
kill -9 $PPID
"""


def test_a_daemon_whose_command_killed_the_launcher_is_found_by_the_runs_own_cgroup(tmp_path):
    """The command kills its parent, the launcher, so its daemon (own session, empty environment)
    goes to init: neither the tree nor the session nor the marker finds it. Started in a cgroup that
    holds nothing else (as a Slurm task or a service is), the doctor finds it there."""
    found = cgroup.folder_of(os.getpid())
    if os.geteuid() != 0 or found is None:
        pytest.skip("needs root and the cgroup v2 hierarchy mounted")
    folder = found / f"dflashdoctor-test-{os.getpid()}-{time.monotonic_ns()}"
    try:
        folder.mkdir()
    except OSError as exc:
        pytest.skip(f"cannot make a cgroup here: {exc.strerror}")
    script, pids_file = tmp_path / "kills.sh", tmp_path / "pids"
    script.write_text(_KILLS_ITS_LAUNCHER)
    doctor = [sys.executable, "-m", "dflashdoctor", "run", "--report-dir", str(tmp_path / "report")]
    in_cgroup = f'echo $$ > {folder}/cgroup.procs && exec "$@"'
    daemon = 0
    try:
        with open(tmp_path / "output", "wb") as output:  # not a pipe: the daemon would hold it open
            code = subprocess.run(
                ["sh", "-c", in_cgroup, "sh", *doctor, "--", "sh", str(script), str(pids_file)],
                stdout=output,
                stderr=subprocess.STDOUT,
                timeout=300,
            ).returncode
        (daemon,) = read_pids(pids_file)
        assert code == 1, (tmp_path / "output").read_text(errors="replace")[-3000:]
        document = json.loads((tmp_path / "report" / "report.json").read_text())
        (left,) = [f for r in document["results"] for f in r["findings"] if f["code"] == "processes-left-running"]
        assert left["evidence"]["left_running"] == [{"pid": daemon, "command": "sleep 319"}]
        assert not running(daemon)
    finally:
        kill_left([daemon], "sleep 319")
        _wait_until_empty(folder)
        folder.rmdir()


def _wait_until_empty(folder: Path) -> None:
    deadline = time.monotonic() + 30
    while cgroup.members(folder) and time.monotonic() < deadline:
        time.sleep(0.05)
