"""What `run` leaves the program it watches: its priority and CPUs, its imports, its time at the end.

The watch sleeps on a thread that steps aside (idle scheduling, one CPU), and the launcher after it
started the command; neither may pass that to the command, whose scheduling must be what it is
without the doctor. The agent must not import dynamo into a process that never compiles (about a
second of CPU in every data-loader worker and Inductor compile worker), yet dynamo must still skip
the instrumentation's frames once the program imports it. Real child processes throughout.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.conftest import run_cli

LINUX = pytest.mark.skipif(sys.platform != "linux", reason="scheduling is per thread on Linux only")

_SCHEDULING = (
    "import json, os; print('SCHED', json.dumps([os.sched_getscheduler(0), os.getpriority(os.PRIO_PROCESS, 0), "
    "sorted(os.sched_getaffinity(0))]))"
)


def _scheduling(stdout: str) -> list[object]:
    line = next(line for line in stdout.splitlines() if line.startswith("SCHED "))
    return json.loads(line.removeprefix("SCHED "))


@LINUX
def test_the_command_keeps_the_scheduling_it_has_without_the_doctor(tmp_path):
    plain = subprocess.run([sys.executable, "-c", _SCHEDULING], capture_output=True, text=True, check=True)
    result = run_cli(tmp_path, "run", "--", sys.executable, "-c", _SCHEDULING, timeout=120)
    assert result.code == 0, result.stdout + result.stderr
    watched = _scheduling(result.stdout)
    assert watched == _scheduling(plain.stdout)
    assert watched[0] == os.SCHED_OTHER


@LINUX
def test_stepping_aside_lowers_only_the_thread_that_asks(tmp_path):
    from dflashdoctor.runs.priority import step_aside

    before = (os.sched_getscheduler(0), os.sched_getaffinity(0))
    seen: list[tuple[int, set[int]]] = []

    def aside() -> None:
        step_aside()
        seen.append((os.sched_getscheduler(0), os.sched_getaffinity(0)))

    thread = threading.Thread(target=aside)
    thread.start()
    thread.join()
    ((policy, cpus),) = seen
    assert policy in (os.SCHED_IDLE, os.SCHED_OTHER)  # OTHER at nice 19 where idle is refused
    allowed = before[1]
    assert cpus == ({max(allowed)} if len(allowed) > 1 else allowed)
    assert (os.sched_getscheduler(0), os.sched_getaffinity(0)) == before  # this thread untouched


def test_a_process_that_never_compiles_does_not_import_dynamo_under_run(tmp_path):
    script = "import sys, torch; torch.ones(2).sum(); print('DYNAMO', 'torch._dynamo' in sys.modules)"
    result = run_cli(tmp_path, "run", "--", sys.executable, "-c", script, timeout=180)
    assert result.code == 0, result.stdout + result.stderr
    assert "DYNAMO False" in result.stdout
    assert result.report["results"][0]["measurements"]["instrumented"] == 1  # the agent did install


def test_frames_marked_before_dynamo_loads_are_skipped_once_it_does(tmp_path):
    """Marked while dynamo is absent, the marks wait; as dynamo loads they are applied: a compiled
    call of a marked function captures no graph, an unmarked twin captures one."""
    script = Path(tmp_path, "marks.py")
    script.write_text(
        "import sys\n"
        "import torch\n"
        "from dflashdoctor.hooks.dynamo_skip import skip_frame\n"
        "def marked(x):\n    return x + 1\n"
        "def unmarked(x):\n    return x + 1\n"
        "skip_frame(marked)\n"
        "assert 'torch._dynamo' not in sys.modules\n"
        "import torch._dynamo\n"
        "from torch._dynamo.utils import counters\n"
        "torch.compile(marked, backend='eager')(torch.ones(2))\n"
        "after_marked = counters['stats']['unique_graphs']\n"
        "torch.compile(unmarked, backend='eager')(torch.ones(2))\n"
        "print('GRAPHS', after_marked, counters['stats']['unique_graphs'])\n"
    )
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    assert "GRAPHS 0 1" in done.stdout
