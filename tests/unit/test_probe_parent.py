"""A probe kills itself once the process that started it is gone (probe_support._die_with_parent);
a parent pid in its environment that names some other live process, or is not a pid, never makes a
healthy probe kill itself. Real child interpreters."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from dflashdoctor.probe_support import PARENT_VARIABLE
from tests.paths import ROOT

_PROBE = """import time
from dflashdoctor import probe_support
probe_support._die_with_parent()
time.sleep(2.5)
print('alive')
"""


_THIS_PROCESS = "this-process"  # the test's own pid, named when it runs (each test worker has its own)


@pytest.mark.parametrize("given", ["1", _THIS_PROCESS, "not-a-pid", "0", ""])
def test_a_parent_variable_naming_a_live_process_or_nothing_is_not_believed(given):
    pid = str(os.getpid()) if given == _THIS_PROCESS else given
    env = {**os.environ, PARENT_VARIABLE: pid, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout) == (0, "alive\n"), done.stderr


def test_a_parent_already_gone_when_the_probe_starts_is_seen():
    """The pid of a process that has ended (and so is not this probe's parent): the probe kills itself."""
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    env = {**os.environ, PARENT_VARIABLE: str(gone.pid), "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == -9 and done.stdout == ""
