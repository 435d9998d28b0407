"""What a finished child leaves running is found by its group and session, by the process tree below
its launcher, and by the marker in the environment its descendants inherit
(dflashdoctor/leftovers.py): real processes, a daemon that left the group, a process of another local
user carrying the same marker (not ours) and one that is in the child's session (ours), and a probe's
target and script that leave a forked child and a setsid daemon behind (`trace-attention --script`)."""

from __future__ import annotations

import os
import subprocess
import time

import pytest

from dflashdoctor.leftovers import Lineage, command_of, running, still_running, stop_leftovers
from dflashdoctor.processes import pid_alive
from tests.conftest import run_cli, start_as_nobody

_MARKER = "DFLASHDOCTOR_PROBE_ID=test-marker-1234"


def _by(group: int, **more: int) -> Lineage:
    return Lineage(_MARKER, group=group, **more)


def _finished_group() -> int:
    """The process group of a child that has exited: nothing is left in it."""
    child = subprocess.Popen(["true"], start_new_session=True)
    child.wait()
    return child.pid


def test_the_kernels_and_inits_groups_sessions_and_trees_are_never_a_childs():
    for pid in (0, 1):
        assert still_running(_by(pid, session=pid, root=pid)) == set()


def _wait_until(check, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check() and time.monotonic() < deadline:
        time.sleep(0.05)


def test_a_marked_daemon_is_found_and_stopped_and_an_unmarked_one_is_left_alone():
    env = {**os.environ, "DFLASHDOCTOR_PROBE_ID": "test-marker-1234"}
    marked = subprocess.Popen(["sleep", "300"], env=env, start_new_session=True)
    unmarked = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        group = _finished_group()
        _wait_until(lambda: marked.pid in still_running(_by(group)))
        assert still_running(_by(group)) == {marked.pid}
        left = stop_leftovers(_by(group), settle_s=0)
        assert left == [{"pid": marked.pid, "command": "sleep 300"}]
        marked.wait(timeout=30)
        assert pid_alive(unmarked.pid) and still_running(_by(group)) == set()
    finally:
        for process in (marked, unmarked):
            process.kill()
            process.wait()


def test_another_users_process_carrying_the_marker_is_not_ours():
    """As root, every process's environment is readable: one of nobody's that copies the marker
    must neither be stopped by root nor make root's job look unfinished."""
    intruder = start_as_nobody(
        ["sleep", "300"], {"PATH": os.environ["PATH"], "DFLASHDOCTOR_PROBE_ID": "test-marker-1234"}
    )
    try:
        _wait_until(
            lambda: os.path.exists(f"/proc/{intruder.pid}") and os.stat(f"/proc/{intruder.pid}").st_uid == 65534
        )
        time.sleep(0.2)  # setpriv has exec'd sleep: the environment is the one given
        group = _finished_group()
        assert intruder.pid not in still_running(_by(group))
        assert stop_leftovers(_by(group), settle_s=0) == [] and intruder.poll() is None
    finally:
        intruder.kill()
        intruder.wait()


def test_another_users_process_in_the_childs_session_is_the_childs_and_root_stops_it():
    """A session is joined only by being started in it: a process of nobody's left there by the child
    (which dropped privileges for it, then exited) is the child's descendant, found without any
    marker, and stopped."""
    if os.geteuid() != 0:
        pytest.skip("starting a process as another user needs root")
    leader = subprocess.Popen(
        ["sh", "-c", "setpriv --reuid=65534 --regid=65534 --clear-groups env -i sleep 316 &"],
        start_new_session=True,
    )
    assert leader.wait(timeout=30) == 0  # the child has ended: what is left in its session is its leftover
    left: list[int] = []
    try:
        _wait_until(lambda: any(command_of(pid) == "sleep 316" for pid in still_running(_by(0, session=leader.pid))))
        left = sorted(still_running(_by(0, session=leader.pid)))
        assert [command_of(pid) for pid in left] == ["sleep 316"]
        assert stop_leftovers(_by(0, session=leader.pid), settle_s=0) == [{"pid": left[0], "command": "sleep 316"}]
        _wait_until(lambda: not running(left[0]))
    finally:
        for pid in left:
            if running(pid) and command_of(pid) == "sleep 316":
                os.kill(pid, 9)


def test_the_tree_below_a_root_is_the_childs_and_the_root_is_not():
    """What a launcher (the root) started, and what that started in turn in a session of its own
    with an empty environment, is found by the parent links; the launcher itself and its siblings
    are not."""
    root = subprocess.Popen(
        ["sh", "-c", "setsid env -i sleep 317 & wait"], start_new_session=True, stdout=subprocess.DEVNULL
    )
    sibling = subprocess.Popen(["sleep", "318"], start_new_session=True)
    try:
        # the command itself, once exec'd: before that the daemon's pid still runs `setsid env -i ...`
        _wait_until(lambda: any(command_of(pid) == "sleep 317" for pid in still_running(_by(0, root=root.pid))))
        (daemon,) = still_running(_by(0, root=root.pid))
        assert command_of(daemon) == "sleep 317" and root.pid != daemon
        assert stop_leftovers(_by(0, root=root.pid), settle_s=0) == [{"pid": daemon, "command": "sleep 317"}]
        assert root.wait(timeout=30) == 0 and sibling.poll() is None
    finally:
        for process in (root, sibling):
            process.kill()
            process.wait()


_SCRIPT_LEAVES = """
import os, subprocess, sys, time
daemon = subprocess.Popen(["sleep", "303"], start_new_session=True)
forked = os.fork()
if forked == 0:
    time.sleep(300)
    os._exit(0)
open(sys.argv[1], "w").write(f"{daemon.pid} {forked}")
"""


def test_a_scripts_forked_child_and_setsid_daemon_are_named_and_stopped(tmp_path):
    script, pids_file = tmp_path / "leaves.py", tmp_path / "pids"
    script.write_text(_SCRIPT_LEAVES)
    run = run_cli(tmp_path, "trace-attention", "--script", str(script), "--", str(pids_file))
    daemon, forked = map(int, pids_file.read_text().split())
    (left,) = run.findings("processes-left-running")
    named = {entry["pid"]: entry["command"] for entry in left["evidence"]["left_running"]}
    assert set(named) == {daemon, forked} and named[daemon] == "sleep 303", named
    assert "probe trace-attention" in left["title"]
    assert run.code == 1, run.stdout[-3000:] + run.stderr[-2000:]
    _wait_until(lambda: not pid_alive(daemon) and not pid_alive(forked), 15)
    assert not pid_alive(daemon) and not pid_alive(forked)


def test_a_script_that_leaves_nothing_has_no_such_finding(tmp_path):
    script = tmp_path / "tidy.py"
    script.write_text("import subprocess\nsubprocess.run(['true'], check=True)\n")
    run = run_cli(tmp_path, "trace-attention", "--script", str(script))
    assert not run.findings("processes-left-running"), run.stdout[-2000:]


_WARMS_INDUCTORS_POOL = """
import os
import torch._inductor.config as config
config.compile_threads = 2
from torch._inductor.async_compile import AsyncCompile
AsyncCompile.warm_pool()
assert type(AsyncCompile.process_pool()).__name__ == "SubprocPool"
print(os.getpid(), flush=True)
os._exit(0)  # as a probe ends: no teardown, so the pool is not shut down
"""


def test_inductors_compile_workers_are_stopped_and_never_named_as_the_programs():
    """A probe that compiled (trace-attention in a warm gate on an H200) exits with os._exit; torch's
    compile-worker pool then outlives it for seconds before it ends itself. It is torch's, not the
    program's: stopped, never a `processes-left-running`. A daemon beside it still is named."""
    import sys

    env = {**os.environ, "DFLASHDOCTOR_PROBE_ID": "test-marker-1234"}
    daemon = subprocess.Popen(["sleep", "300"], env=env, start_new_session=True)
    child = subprocess.Popen(
        [sys.executable, "-c", _WARMS_INDUCTORS_POOL], env=env, start_new_session=True, stdout=subprocess.PIPE
    )
    try:
        child.wait(timeout=120)
        workers = still_running(_by(child.pid)) - {daemon.pid}
        assert workers, "the pool had ended before it could be looked at"
        assert all("torch/_inductor/compile_worker/__main__.py" in command_of(pid) for pid in workers)
        # no settling: the pool is certainly still there (it takes about 2 s to go on the 2-core CPU)
        left = stop_leftovers(_by(child.pid), settle_s=0)
        assert left == [{"pid": daemon.pid, "command": "sleep 300"}]
        _wait_until(lambda: not still_running(_by(child.pid)), timeout_s=15)
        assert not still_running(_by(child.pid))
    finally:
        daemon.kill()
        daemon.wait()


_NEVER_REAPS = """
import subprocess, sys, time
child = subprocess.Popen(["sleep", "300"], env={"DFLASHDOCTOR_PROBE_ID": "test-marker-1234"}, start_new_session=True)
print(child.pid, flush=True)
time.sleep(300)  # never waits for it: once it is killed it stays a zombie
"""


def test_a_killed_leftover_left_a_zombie_by_its_parent_counts_as_ended():
    """Orphans are reaped by init, which in a container may do so late or never; a stopped leftover
    that waits there as a zombie has ended, and the doctor must not wait out its grace periods for
    it (it did, on the H200's Firecracker VM: 1.6 s after every probe that compiled)."""
    import sys

    parent = subprocess.Popen([sys.executable, "-c", _NEVER_REAPS], stdout=subprocess.PIPE, start_new_session=True)
    try:
        assert parent.stdout is not None
        leftover = int(parent.stdout.readline())
        assert running(leftover)
        named = stop_leftovers(_by(_finished_group()), settle_s=0)
        assert named == [{"pid": leftover, "command": "sleep 300"}]
        # SIGTERM ended it and its parent never reaped it: a pid still, a zombie, no longer running
        assert pid_alive(leftover) and not running(leftover)
    finally:
        parent.kill()
        parent.wait()


def test_a_group_and_session_whose_number_was_taken_again_are_not_the_childs():
    """A probe ends; with pid_max at 32768 its number was handed out again within the settle time, to
    the session leader of a probe another gate started, which was then killed as the first one's
    leftover (a gate's env probe, SIGKILL, in the full suite on two workers). A running process
    that holds the number is a new one, and what is in its group or session is its own."""
    taken = subprocess.Popen(["sleep", "319"], start_new_session=True)
    try:
        lineage = Lineage("DFLASHDOCTOR_PROBE_ID=never-set", group=taken.pid, session=taken.pid)
        assert still_running(lineage) == set()
        assert stop_leftovers(lineage, settle_s=0) == [] and taken.poll() is None
    finally:
        taken.kill()
        taken.wait()
