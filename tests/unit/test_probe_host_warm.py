"""The probe host's warm thread (forkserver/server.py) runs beside the main thread's imports and
may import nothing itself: an import asked for on it is refused (its value is then left to the
probes), while the main thread goes on importing. Real imports of standard-library modules, in a
child interpreter so that none of them is imported before."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.paths import ROOT

_CHILD = """
import json, sys
from dflashdoctor.forkserver import server
assert "xml.dom.minidom" not in sys.modules and "wave" not in sys.modules
joined = server._warm_beside(("os:getpid", "xml.dom.minidom"))
import wave  # the main thread imports while the warm thread runs
print(json.dumps({
    "warmed": joined(),
    "minidom": "xml.dom.minidom" in sys.modules,
    "wave": "wave" in sys.modules,
    "finder_left": any(type(f).__name__ == "_ImportsRefused" for f in sys.meta_path),
}))
"""


def test_the_warm_thread_may_not_import_and_the_main_thread_still_may():
    done = subprocess.run(
        [sys.executable, "-c", _CHILD], capture_output=True, text=True, cwd=ROOT, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    # os is imported already: its function is called; xml.dom.minidom is not: refused
    assert json.loads(done.stdout) == {"warmed": ["os:getpid"], "minidom": False, "wave": True, "finder_left": False}
