"""The probe host: one interpreter that imports torch, dynamo and Inductor once, then forks a probe
for each request, so that the gate's probes do not each spend seconds of CPU importing them.

    python -m dflashdoctor.forkserver.server

Probed side (standard library; torch is only imported). Protocol, one JSON object per line: the host
says {"ready": true, "imported_s": ...} once its imports are done (or {"ready": false, "error": ...}
and exits); each request on stdin, {"id", "argv", "env", "stdout", "stderr"}, is answered with
{"id", "pid"} once forked, and every child's end with {"pid", "returncode"} (negative: the signal).
The host never initialises CUDA (and refuses to serve if its imports loaded the CUDA driver), so
a fork is safe as a DataLoader worker's is; each child starts its own session (its pid is its
process group, which the doctor signals and kills as it would a probe it started itself), takes
the request's environment, and runs the probe script as `python SCRIPT ARGS` would. At the end of
its stdin (the doctor exited, or was killed) the host kills every child it still has and exits:
nothing outlives the doctor.
"""

from __future__ import annotations

import contextlib
import json
import os
import runpy
import select
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import Any

WARM_MODULES = ("torch", "torch._dynamo", "torch._inductor.compile_fx")
_POLL_S = 0.05


def _say(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def _child(request: dict[str, Any]) -> None:
    """In the forked child: become the probe. Never returns."""
    code = 1
    try:
        os.setsid()
        for fd, path, flags in (
            (0, os.devnull, os.O_RDONLY),
            (1, request["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
            (2, request["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
        ):
            opened = os.open(path, flags, 0o600)
            os.dup2(opened, fd)
            os.close(opened)
        os.environ.clear()
        os.environ.update(request["env"])
        script = request["argv"][0]
        with contextlib.suppress(OSError):  # named as its probe in ps and top, not as the host
            Path("/proc/self/comm").write_text(f"probe-{Path(script).stem}"[:15])
        sys.argv = list(request["argv"])
        sys.path[0] = os.path.dirname(os.path.abspath(script))  # as `python SCRIPT` has it
        signal.signal(signal.SIGINT, signal.default_int_handler)
        runpy.run_path(script, run_name="__main__")
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _returncode(status: int) -> int:
    return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


def _reap(children: set[int]) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        children.discard(pid)
        _say({"pid": pid, "returncode": _returncode(status)})


def _serve() -> None:
    children: set[int] = set()
    buffered = b""
    stdin = sys.stdin.fileno()
    while True:
        readable, _, _ = select.select([stdin], [], [], _POLL_S)
        _reap(children)
        if not readable:
            continue
        chunk = os.read(stdin, 65536)
        if not chunk:  # the doctor is gone: its probes go with it
            for pid in children:
                with contextlib.suppress(OSError):
                    os.killpg(pid, signal.SIGKILL)
            return
        buffered += chunk
        while b"\n" in buffered:
            line, buffered = buffered.split(b"\n", 1)
            request = json.loads(line)
            pid = os.fork()
            if pid == 0:
                _child(request)
            children.add(pid)
            _say({"id": request["id"], "pid": pid})


def main() -> None:
    started = time.perf_counter()
    try:
        for name in WARM_MODULES:
            __import__(name)
    except BaseException as exc:  # the probes would fail the same way alone: the doctor starts them alone
        _say({"ready": False, "error": f"{type(exc).__name__}: {exc}"})
        return
    touched = _cuda_touched()
    if touched:
        _say({"ready": False, "error": touched})
        return
    _say({"ready": True, "imported_s": round(time.perf_counter() - started, 3)})
    _serve()


def _cuda_touched() -> str | None:
    """Why forking would break CUDA in the probes, or None. The CUDA driver does not survive a
    fork once initialised, and its library is only loaded when it is: so the host refuses when
    torch initialised CUDA or the driver's library is mapped after the imports (a torch that
    probes the GPU at import), and the probes then start alone."""
    import torch

    if torch.cuda.is_initialized():
        return "torch initialised CUDA while importing"
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return "cannot tell whether the CUDA driver is loaded (no /proc/self/maps)"
    return "the CUDA driver was loaded while importing" if "libcuda.so" in maps else None


if __name__ == "__main__":
    main()
