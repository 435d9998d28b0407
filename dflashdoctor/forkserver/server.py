"""The probe host: one interpreter that imports torch and dynamo (and, for CPU compiles, Inductor)
once, then forks a probe for each request, so that the gate's probes do not each spend seconds of
CPU importing them.

    python -m dflashdoctor.forkserver.server [--device auto|cpu|cuda]

Probed side (standard library; torch is only imported). Protocol, one JSON object per line: the host
says {"ready": true, "imported": [...], "imported_s": ..., "warmed": [...], "warm_s": ...} once its
imports are done (or {"ready": false, "error": ...} and exits); each request on stdin, {"id",
"argv", "env", "stdout", "stderr"}, is answered with {"id", "pid"} once forked, and every child's end
with {"pid", "returncode"} (negative: the signal). The host never initialises CUDA (and refuses to
serve if its imports initialised the driver), so a fork is safe as a DataLoader worker's is; each
child starts its own session (its pid is its process group, which the doctor signals and kills as
it would a probe it started itself), takes the request's environment, and runs the probe script as
`python SCRIPT ARGS` would. At the end of its stdin (the doctor exited, or was killed) the host
kills every child it still has and exits: nothing outlives the doctor.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.abc
import json
import os
import runpy
import select
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dflashdoctor.probe_support import PARENT_VARIABLE
from dflashdoctor.processes import kill_with_group

WARM_MODULES = ("torch", "torch._dynamo", "torch._inductor.compile_fx")
# Where the probes compute on a GPU, Inductor's compile_fx is left to each probe: on torch 2.11 with
# CUDA its import initialises the CUDA driver (it opens /dev/nvidiactl; torch and dynamo do not,
# reports/examples/h200-gate-probe-host/), and no fork survives that.
WARM_MODULES_GPU = WARM_MODULES[:2]
# Environment variables a probe may set and still be forked: what the host imported reads them when
# used, never at import, so a forked probe that sets them gets what a fresh interpreter would.
# TRITON_INTERPRET: `triton.jit` reads it (triton.knobs, os.environ) as it decorates a kernel, and
# the probes that set it (the race's stub) decorate theirs after the fork.
READ_WHEN_USED = frozenset({"TRITON_INTERPRET"})
# Values Inductor computes on a process's first compile and keeps for the process's life, each a
# cached function of torch's or triton's installed source (hashing them is a few tenths of a second
# of CPU per probe) or of this CPU. Computed here once, every forked probe finds them done. Names, not
# imports: a torch without one of them only warms the rest.
# (triton_key moved: torch 2.13 has it in codecache, 2.11 in runtime.triton_compat, triton's own cache)
_WARM_VALUES = (
    "torch._inductor.codecache:torch_key",
    "torch._inductor.codecache:triton_key",
    "torch._inductor.runtime.triton_compat:triton_key",
)
# Only where the probes compile for the CPU: which vector instructions this CPU runs, found by
# building and loading a test library in a child interpreter for each candidate (1.3 s on the 2-core
# CI machine). It mostly waits for those children, so it runs on a thread beside the last imports,
# once the modules it uses are imported; the thread may import nothing itself (_ImportsRefused).
_CPU_ISA_MODULES = (
    "torch._inductor.codecache",
    "torch._inductor.cpu_vec_isa",
    "torch._inductor.cpp_builder",
    "torch.utils.cpp_extension",
)
_CPU_ISA = ("torch._inductor.cpu_vec_isa:valid_vec_isa_list",)
_POLL_S = 0.05


def _say(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def _child(request: dict[str, Any], host: int) -> None:
    """In the forked child of `host`: become the probe. Never returns."""
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
        os.environ[PARENT_VARIABLE] = str(host)  # the probe dies with the host, which dies with the doctor
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
                kill_with_group(pid)
            return
        buffered += chunk
        while b"\n" in buffered:
            line, buffered = buffered.split(b"\n", 1)
            try:
                request = json.loads(line)
            except ValueError:  # only the doctor writes here; a line it did not mean is not a probe
                continue
            if not isinstance(request, dict) or not {"id", "argv", "env", "stdout", "stderr"} <= request.keys():
                continue
            host = os.getpid()
            pid = os.fork()
            if pid == 0:
                _child(request, host)
            children.add(pid)
            _say({"id": request["id"], "pid": pid})


def _compiles_for_cpu(device: str) -> bool:
    """Whether the probes will compile CPU kernels. `auto` takes CUDA where a GPU is usable, which
    the host may not ask (asking initialises CUDA, which no fork survives): where no NVIDIA device
    node exists, no probe can use one."""
    return device == "cpu" or (device == "auto" and not Path("/dev/nvidiactl").exists())


def _warm(names: tuple[str, ...]) -> list[str]:
    """Import each `module` or call each `module:function`; what worked. A name this torch lacks, or
    one that fails, is left to the probes, which compute it themselves as they would alone."""
    warmed = []
    for name in names:
        module, _, function = name.partition(":")
        try:
            value = __import__(module, fromlist=["_"])
            if function:
                getattr(value, function)()
        except Exception:
            continue
        warmed.append(name)
    return warmed


class _ImportsRefused(importlib.abc.MetaPathFinder):
    """Refuses every import asked for on one thread. Two threads importing at once can deadlock in
    the import system, so the warm thread, which runs beside the main thread's imports, may not
    import: refused, its call fails and the value is left to the probes (a torch whose check needs
    a module not imported before costs time, never a hung host)."""

    def __init__(self) -> None:
        self.thread: int | None = None

    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        if threading.get_ident() == self.thread:
            raise ImportError(f"{name} is not imported on the warm thread")


def _warm_beside(names: tuple[str, ...]) -> Callable[[], list[str]]:
    """`_warm(names)` on a thread that may not import; the returned call waits for it (before any
    fork: a fork keeps only the forking thread)."""
    warmed: list[str] = []
    refused = _ImportsRefused()
    sys.meta_path.insert(0, refused)

    def work() -> None:
        refused.thread = threading.get_ident()
        warmed.extend(_warm(names))

    thread = threading.Thread(target=work, name="dflashdoctor-warm", daemon=True)
    thread.start()

    def joined() -> list[str]:
        thread.join()
        sys.meta_path.remove(refused)
        return warmed

    return joined


def _import_and_warm(device: str) -> tuple[list[str], float, list[str]]:
    """The imports (an exception from one means the host cannot serve) with the seconds they took,
    and the warmed values."""
    started = time.perf_counter()
    cpu = _compiles_for_cpu(device)
    modules = WARM_MODULES if cpu else WARM_MODULES_GPU
    __import__(modules[0])
    isa = cpu and _warm(_CPU_ISA_MODULES) == list(_CPU_ISA_MODULES)
    beside = _warm_beside(_CPU_ISA) if isa else list
    for name in modules[1:]:
        __import__(name)
    imported_s = time.perf_counter() - started
    return list(modules), imported_s, _warm(_WARM_VALUES) + beside()


def main() -> None:
    parser = argparse.ArgumentParser(description="the gate's probe host")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    device = parser.parse_args().device
    started = time.perf_counter()
    try:
        imported, imported_s, warmed = _import_and_warm(device)
    except BaseException as exc:  # the probes would fail the same way alone: the doctor starts them alone
        _say({"ready": False, "error": f"{type(exc).__name__}: {exc}"})
        return
    touched = _cuda_touched()
    if touched:
        _say({"ready": False, "error": touched})
        return
    warm_s = round(time.perf_counter() - started - imported_s, 3)
    _say({"ready": True, "imported": imported, "imported_s": round(imported_s, 3), "warmed": warmed, "warm_s": warm_s})
    _serve()
    # Its children are gone and it has nothing to write: tearing down an interpreter with torch,
    # dynamo and Inductor loaded takes a second, which the doctor would wait for at its end.
    sys.stdout.flush()
    os._exit(0)


def _opened(descriptor: str) -> str:
    """What a descriptor of this process refers to; "" for one closed since it was listed."""
    try:
        return os.readlink(f"/proc/self/fd/{descriptor}")
    except OSError:
        return ""


def _cuda_touched() -> str | None:
    """Why forking would break CUDA in the probes, or None. The CUDA driver does not survive a
    fork once initialised (cuInit, or NVML's init), and initialising it opens its device files:
    so the host refuses when torch initialised CUDA or this process holds /dev/nvidia* open after
    the imports, and the probes then start alone. The descriptors, not whether libcuda is mapped,
    tell it: a library loaded is not a driver initialised, and torch.cuda.is_initialized() stays
    False when Inductor's import initialises the driver on its own
    (reports/examples/h200-gate-probe-host/first-try-host-refused/)."""
    import torch

    if torch.cuda.is_initialized():
        return "torch initialised CUDA while importing"
    try:
        descriptors = os.listdir("/proc/self/fd")
    except OSError:
        return "cannot tell whether the CUDA driver is initialised (no /proc/self/fd)"
    held = sorted({path for path in map(_opened, descriptors) if path.startswith("/dev/nvidia")})
    return f"the CUDA driver was initialised while importing (holds {', '.join(held)})" if held else None


if __name__ == "__main__":
    main()
