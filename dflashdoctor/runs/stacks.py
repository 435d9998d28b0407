"""Every thread's stack of a stuck process: py-spy when it is installed (native and idle threads
too), else the agent's faulthandler, asked for with a signal (Python frames only)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

from dflashdoctor.agent.config import STACK_SIGNAL
from dflashdoctor.records import Stacks, ThreadStack

_PY_SPY_TIMEOUT_S = 30
_FAULTHANDLER_WAIT_S = 2.0
_THREAD = re.compile(r"^(Current thread|Thread) (0x[0-9a-f]+)")
_FRAME = re.compile(r'^\s+File "(.+)", line (\d+) in (.+)$')


def dump_stacks(pid: int, events: Path) -> Stacks:
    """`{"tool": ..., "threads": [{"name", "frames": ["file:line in function", ...] innermost last}]}`."""
    py_spy = shutil.which("py-spy")
    if py_spy:
        try:
            return _py_spy(py_spy, pid)
        except (subprocess.SubprocessError, OSError, ValueError) as exc:
            fallback = f"py-spy failed ({type(exc).__name__}: {exc}); "
    else:
        fallback = "py-spy is not installed; "
    result = _faulthandler(pid, events)
    result["note"] = fallback + "Python frames from faulthandler"
    return result


def _py_spy(py_spy: str, pid: int) -> Stacks:
    done = subprocess.run(
        [py_spy, "dump", "--json", "--pid", str(pid)], capture_output=True, text=True, timeout=_PY_SPY_TIMEOUT_S
    )
    if done.returncode != 0:
        raise ValueError(done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"exit {done.returncode}")
    threads: list[ThreadStack] = []
    for thread in json.loads(done.stdout):
        frames = [f"{f['filename']}:{f['line']} in {f['name']}" for f in reversed(thread.get("frames", []))]
        threads.append({"name": thread.get("thread_name") or str(thread.get("thread_id")), "frames": frames})
    return {"tool": "py-spy", "threads": threads}


def _faulthandler(pid: int, events: Path) -> Stacks:
    path = events / f"stacks-{pid}.txt"
    before = path.stat().st_size if path.exists() else 0
    try:
        os.kill(pid, STACK_SIGNAL)
    except OSError as exc:
        return {"tool": "faulthandler", "threads": [], "error": f"cannot signal pid {pid}: {exc.strerror}"}
    deadline = time.monotonic() + _FAULTHANDLER_WAIT_S
    while time.monotonic() < deadline and (not path.exists() or path.stat().st_size == before):
        time.sleep(0.05)
    time.sleep(0.2)  # let it finish writing every thread
    text = path.read_bytes()[before:].decode(errors="replace") if path.exists() else ""
    return {"tool": "faulthandler", "threads": parse_faulthandler(text)}


def parse_faulthandler(text: str) -> list[ThreadStack]:
    """faulthandler lists each thread innermost frame first; ours list innermost last."""
    threads: list[ThreadStack] = []
    for line in text.splitlines():
        head = _THREAD.match(line)
        if head:
            current = "current" if head[1] == "Current thread" else ""
            threads.append({"name": f"thread {head[2]}" + (f" ({current})" if current else ""), "frames": []})
            continue
        frame = _FRAME.match(line)
        if frame and threads:
            threads[-1]["frames"].insert(0, f"{frame[1]}:{frame[2]} in {frame[3].strip()}")
    return threads
