"""Starts a probe in a child process and brings back its one JSON document, whatever happens.

The child is the probed interpreter (this one, or `--python PATH`). It gets dflashdoctor's own
folder on PYTHONPATH, so another environment needs only torch, not dflashdoctor installed. The
child runs in its own process group: on timeout we ask it for every thread's stack (SIGUSR1, see
probe_support), then kill the group. Whichever way it ends, what it started and left running (in
its group or session, or carrying its marker after leaving both: leftovers.py) is named and stopped,
so nothing it started outlives it.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from importlib.util import find_spec
from pathlib import Path
from typing import IO, Any

from dflashdoctor.bytecode import GIVEN_VARIABLE, PROBE_PACKAGES, private_pycache
from dflashdoctor.forkserver.client import HostedChild, current_host
from dflashdoctor.forkserver.server import READ_WHEN_USED
from dflashdoctor.leftovers import Lineage, stop_leftovers
from dflashdoctor.probe_configs import ProbeConfig, to_json
from dflashdoctor.probe_support import PARENT_VARIABLE
from dflashdoctor.processes import kill_with_group, output_tail
from dflashdoctor.records import LeftRunningRecord
from dflashdoctor.remote import SshTarget, run_remote
from dflashdoctor.targets import CWD_LEFT_OFF
from dflashdoctor.trust import vouched

_STACK_DUMP_GRACE_S = 2.0
_TAIL_CHARS = 6000
PROBE_MARKER = "DFLASHDOCTOR_PROBE_ID"  # in each probe's environment, unique to it (leftovers.py)


@dataclass
class ProbeRun:
    """What came back from one probe process."""

    probe: str
    duration_s: float
    returncode: int | None
    timed_out: bool = False
    payload: dict[str, Any] | None = None
    stdout_tail: str = ""
    stderr_tail: str = ""
    argv: list[str] = field(default_factory=list)
    left_running: list[LeftRunningRecord] = field(default_factory=list)  # stopped by the doctor

    def crash_summary(self) -> str:
        if self.timed_out:
            return f"probe {self.probe} timed out after {self.duration_s:.0f} s and was killed"
        if self.returncode is not None and self.returncode < 0:
            try:
                sig = signal.Signals(-self.returncode).name
            except ValueError:
                sig = "unknown signal"
            hint = " (the kernel's OOM killer sends SIGKILL)" if sig == "SIGKILL" else ""
            return f"probe {self.probe} was killed by signal {-self.returncode} ({sig}){hint}"
        return f"probe {self.probe} exited with status {self.returncode} without writing its result"


def probes_dir() -> Path:
    """Where the probe scripts are: `probes/` in a checkout, `dflashdoctor/probes` in a wheel."""
    spec = find_spec("dflashdoctor.probes")
    if spec is not None and spec.submodule_search_locations:
        return Path(next(iter(spec.submodule_search_locations)))
    return Path(__file__).resolve().parent.parent / "probes"


def package_root() -> Path:
    """The folder that holds the dflashdoctor package, for the child's PYTHONPATH."""
    return Path(__file__).resolve().parent.parent


def resolve_python(python: str | None) -> str:
    """The interpreter to probe with; raises ValueError with one line when it is not there."""
    if python is None:
        return sys.executable
    found = shutil.which(python) if os.sep not in python else (python if os.access(python, os.X_OK) else None)
    if not found:
        raise ValueError(f"--python {python}: no such executable")
    try:  # /bin/false is executable too: ask it to be Python before a probe is started in it
        said = subprocess.run([found, "-c", "import sys; print(sys.version_info[0])"], capture_output=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ValueError(f"--python {python}: cannot run it ({exc})") from None
    if said.returncode != 0 or said.stdout.strip() != b"3":
        raise ValueError(f"--python {python}: not a Python 3 interpreter (it exited {said.returncode})")
    return found


def probe_env(python: str) -> dict[str, str]:
    """The environment every probe of `python` starts with (a probe host too)."""
    return {**_env(), **bytecode_env(python)}


def _env() -> dict[str, str]:
    """The child's environment: the current folder first on its path, as `python -m` would have it
    (so `mypkg.attn:fwd` resolves from where the user stands), then dflashdoctor's own folder. A
    current folder others could add a module to (/tmp, a group's folder, another user's: trust.py)
    is left off, unless the user vouched for it: a `torch.py` planted there would run in the probe,
    as root where root runs this; the reason goes to the probe, which names it where a target's
    module is then not found."""
    env = dict(os.environ)
    cwd = os.getcwd()
    refused = vouched().import_folder_problem(cwd, "the current folder")
    parts = ([] if refused else [cwd]) + [str(package_root())]
    parts += [env["PYTHONPATH"]] if env.get("PYTHONPATH") else []
    env["PYTHONPATH"] = os.pathsep.join(parts)
    if refused:
        env[CWD_LEFT_OFF] = refused
    else:
        env.pop(CWD_LEFT_OFF, None)
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def bytecode_env(python: str, packages: tuple[str, ...] = PROBE_PACKAGES) -> dict[str, str]:
    """Bytecode for probes where the interpreter keeps none. An image that sets
    PYTHONDONTWRITEBYTECODE and ships torch (or sympy, transformers: bytecode.PROBE_PACKAGES) without
    bytecode makes every probe compile them from source (seconds each, on an H200 of this
    workplace); probes then keep theirs in a cache of this user's (PYTHONPYCACHEPREFIX), leaving the
    install untouched. Only for this interpreter (another --python is not looked into), and never
    over a prefix the user set."""
    cache = private_pycache(packages) if python == sys.executable else None
    if cache is None:
        return {}
    given = os.environ["PYTHONDONTWRITEBYTECODE"]  # for `env`, which reports the user's setting
    return {"PYTHONPYCACHEPREFIX": str(cache), "PYTHONDONTWRITEBYTECODE": "", GIVEN_VARIABLE: given}


def run_probe(
    probe: str,
    script: str,
    config: ProbeConfig,
    *,
    python: str,
    timeout_s: float,
    env: dict[str, str] | None = None,
    ssh: SshTarget | None = None,
    forkable: bool = False,
) -> ProbeRun:
    """Run one probe to its end or its timeout; `env` is set in the child's environment on top of ours.
    `forkable`: it may be forked from the gate's probe host, if one runs this interpreter.
    With `ssh`, the probe runs on that machine instead (remote.py)."""
    if ssh is not None:
        remote = run_remote(
            ssh,
            script,
            config,
            python=python,
            package=package_root() / "dflashdoctor",
            probes=probes_dir(),
            timeout_s=timeout_s,
            env=env or {},
        )
        return ProbeRun(
            probe=probe,
            duration_s=remote.duration_s,
            returncode=remote.returncode,
            timed_out=remote.timed_out,
            payload=remote.payload,
            stderr_tail=remote.stderr_tail,
            argv=remote.argv,
        )
    with tempfile.TemporaryDirectory(prefix="dflashdoctor-") as tmp:
        work = Path(tmp)
        config_path, out_path = work / "config.json", work / "result.json"
        config_path.write_text(to_json(config), encoding="utf-8")
        argv = [python, str(probes_dir() / script), "--config", str(config_path), "--out", str(out_path)]
        started = time.monotonic()
        marker = f"{PROBE_MARKER}={secrets.token_hex(8)}"
        with open(work / "stdout", "wb") as out, open(work / "stderr", "wb") as err:
            child = _start(argv, python, env or {}, out, err, work, marker=marker, forkable=forkable)
            timed_out = False
            try:
                child.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
                _stop(child)
            except BaseException:  # the doctor interrupted (Ctrl-C, SIGTERM): its probe goes with it
                kill_with_group(child.pid)
                stop_leftovers(Lineage(marker, group=child.pid, session=child.pid), settle_s=0)
                raise
            finally:
                if (running := _running.get()) is not None:
                    running.discard(child.pid)
            left_running = stop_leftovers(Lineage(marker, group=child.pid, session=child.pid))
        run = ProbeRun(
            probe=probe,
            duration_s=round(time.monotonic() - started, 3),
            returncode=child.returncode,
            timed_out=timed_out,
            stdout_tail=output_tail(work / "stdout", _TAIL_CHARS),
            stderr_tail=output_tail(work / "stderr", _TAIL_CHARS),
            argv=argv,
            left_running=left_running,
        )
        if not timed_out and out_path.exists():
            try:
                run.payload = json.loads(out_path.read_text(encoding="utf-8"))
            except json.JSONDecodeError:
                run.payload = None
        return run


class RunningProbes:
    """The probe processes one gate has running, so that a gate stopped while several run at once
    (its threads) stops them all, not only the one its main thread waits for. One set per gate
    (`probe_set`): a stop is that gate's, never the process's, where a later gate (the pytest plugin,
    a notebook) must still start its own probes."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._children: set[int] = set()  # process groups
        self.stopping = False

    def add(self, pid: int) -> None:
        with self._lock:
            self._children.add(pid)
            if self.stopping:  # started as the gate stops: it goes at once
                kill_with_group(pid)

    def discard(self, pid: int) -> None:
        with self._lock:
            self._children.discard(pid)

    def stop_all(self) -> None:
        with self._lock:
            self.stopping = True
            for pid in self._children:
                kill_with_group(pid)


_running: ContextVar[RunningProbes | None] = ContextVar("dflashdoctor_running_probes", default=None)


@contextlib.contextmanager
def probe_set() -> Iterator[RunningProbes]:
    """Within this block (and in threads started with its context), the probes started are this
    set's: `stop_all` stops them and those started after it, and nothing outside the block."""
    running = RunningProbes()
    token = _running.set(running)
    try:
        yield running
    finally:
        _running.reset(token)


def _start(
    argv: list[str],
    python: str,
    env: dict[str, str],
    out: IO[bytes],
    err: IO[bytes],
    work: Path,
    *,
    marker: str,
    forkable: bool,
) -> subprocess.Popen[bytes] | HostedChild:
    """The probe's process: forked from the gate's probe host where the probe may be, one runs this
    interpreter, and the probe's own environment holds only variables read when used (what the
    host imported might read others at import); else started afresh. Either way its environment
    holds `marker` ("NAME=value"), which whatever it starts inherits."""
    name, value = marker.split("=", 1)
    host = current_host(python) if forkable and set(env) <= READ_WHEN_USED else None
    hosted_env = {**probe_env(python), **env, name: value}
    child: subprocess.Popen[bytes] | HostedChild | None
    child = host.start(argv[1:], hosted_env, work / "stdout", work / "stderr") if host else None
    if child is None:
        child = subprocess.Popen(
            argv,
            stdout=out,
            stderr=err,
            stdin=subprocess.DEVNULL,
            env={**hosted_env, PARENT_VARIABLE: str(os.getpid())},  # it dies with this doctor
            start_new_session=True,
        )
    if (running := _running.get()) is not None:
        running.add(child.pid)
    return child


def _stop(child: subprocess.Popen[bytes] | HostedChild) -> None:
    """Ask for thread stacks, give them a moment to reach stderr, then kill the whole group."""
    try:
        os.killpg(child.pid, signal.SIGUSR1)
        child.wait(timeout=_STACK_DUMP_GRACE_S)
    except (subprocess.TimeoutExpired, ProcessLookupError, PermissionError):
        pass
    kill_with_group(child.pid)
    child.wait()
