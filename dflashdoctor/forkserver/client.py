"""Doctor side of the probe host (server.py): start it, ask it for probes, wait for them.

The host starts importing at once, while probes that cannot use it (another interpreter, an
environment of their own) start as their own processes beside it; the first hosted probe waits
for its imports.

A hosted probe behaves as one the runner started itself: its pid is its process group, it is asked
for its stacks and killed the same way, and its exit status comes back (from the host, which is its
parent). Whatever goes wrong with the host (it cannot import torch, it dies, it does not answer)
is never a lost probe: `start` returns None and the runner starts that probe as its own process.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import select
import signal
import subprocess
import threading
from collections.abc import Iterator
from contextvars import ContextVar
from pathlib import Path

from dflashdoctor.processes import kill_with_group

_READY_TIMEOUT_S = 120.0
_ANSWER_TIMEOUT_S = 10.0


class HostedChild:
    """A probe forked by the host, with the part of Popen's interface the runner uses."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._done = threading.Event()

    def finished(self, returncode: int) -> None:
        self.returncode = returncode
        self._done.set()

    def wait(self, timeout: float | None = None) -> int:
        if not self._done.wait(timeout):
            raise subprocess.TimeoutExpired(f"hosted probe {self.pid}", timeout or 0.0)
        assert self.returncode is not None
        return self.returncode


class ProbeHost:
    """One host process and the probes it forked; thread-safe (the gate starts probes at once)."""

    def __init__(self, python: str, process: subprocess.Popen[bytes]) -> None:
        self.python = python
        self._process = process
        self._lock = threading.Lock()
        self._ids = itertools.count()
        self._answers: dict[int, int] = {}  # request id -> pid
        self._asked: dict[int, threading.Event] = {}
        self._children: dict[int, HostedChild] = {}
        self._early: dict[int, int] = {}  # pid -> returncode, when the end came before the answer was read
        self.alive = True
        self._checked = False  # whether its first line was read (on the first `start`)
        self.imported_s: float | None = None
        self.imported: list[str] = []  # the modules it imported once for every probe
        self.warmed: list[str] = []  # what it computed once for every probe, besides its imports
        self.refused: str | None = None  # why it would not serve, in its own words
        self._reader = threading.Thread(target=self._read, name="dflashdoctor-probe-host", daemon=True)

    @classmethod
    def open(cls, python: str, env: dict[str, str], device: str = "auto") -> ProbeHost | None:
        """A host that is importing, or None when it cannot be started (the probes run alone); whether
        its imports worked is read when the first probe asks for it. `device`: where the probes
        compute (the gate's setting), which decides what the host computes for them beforehand."""
        argv = [python, "-m", "dflashdoctor.forkserver.server", "--device", device]
        try:
            process = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
            )
        except OSError:
            return None
        return cls(python, process)

    def _ready(self) -> bool:
        """Its first line, within the time importing torch may take; a host that says nothing by then
        is given up on."""
        assert self._process.stdout is not None
        ready, _, _ = select.select([self._process.stdout], [], [], _READY_TIMEOUT_S)
        if not ready:
            return False
        try:
            hello = json.loads(self._process.stdout.readline())
        except ValueError:
            return False
        self.imported_s = hello.get("imported_s")
        self.refused = str(hello.get("error") or "")[:300] or None
        imported, warmed = hello.get("imported"), hello.get("warmed")
        self.imported = [str(name) for name in imported] if isinstance(imported, list) else []
        self.warmed = [str(name) for name in warmed] if isinstance(warmed, list) else []
        return bool(hello.get("ready"))

    def _read(self) -> None:
        assert self._process.stdout is not None
        for line in self._process.stdout:
            try:
                message = json.loads(line)
            except ValueError:
                continue
            with self._lock:
                if "id" in message:
                    self._answers[message["id"]] = message["pid"]
                    self._asked[message["id"]].set()
                elif "returncode" in message:
                    child = self._children.get(message["pid"])
                    if child is None:
                        self._early[message["pid"]] = message["returncode"]
                    else:
                        child.finished(message["returncode"])
        self._host_gone()

    def _host_gone(self) -> None:
        """The host died: its probes are orphans now; say each one was killed, and kill it."""
        with self._lock:
            self.alive = False
            for event in self._asked.values():
                event.set()
            for child in self._children.values():
                if child.returncode is None:
                    kill_with_group(child.pid)
                    child.finished(-signal.SIGKILL)

    def start(self, argv: list[str], env: dict[str, str], stdout: Path, stderr: Path) -> HostedChild | None:
        """Fork `argv` (a probe script and its arguments) in the host; None if the host cannot."""
        with self._lock:
            if not self._checked:  # the first probe waits for the imports; the others find them done
                self._checked = True
                self.alive = self._ready()
                if self.alive:
                    self._reader.start()
        if not self.alive or self._process.stdin is None:
            return None
        with self._lock:
            request_id = next(self._ids)
            asked = self._asked[request_id] = threading.Event()
        request = {"id": request_id, "argv": argv, "env": env, "stdout": str(stdout), "stderr": str(stderr)}
        try:
            with self._lock:
                self._process.stdin.write((json.dumps(request) + "\n").encode())
                self._process.stdin.flush()
        except OSError:
            return None
        if not asked.wait(_ANSWER_TIMEOUT_S):  # stuck: stopped, so that it cannot fork this probe later too
            with contextlib.suppress(OSError):
                os.killpg(self._process.pid, signal.SIGKILL)
            return None
        with self._lock:
            pid = self._answers.pop(request_id, None)
            if pid is None:
                return None
            child = self._children[pid] = HostedChild(pid)
            if pid in self._early:
                child.finished(self._early.pop(pid))
        return child

    def describe(self) -> str:
        """One line for the report's environment: what the gate's probes were forked from."""
        if not self._checked:
            return "not used: no probe could be forked from it"
        if not self.alive:
            why = f" ({self.refused})" if self.refused else ""
            return f"not used: the probe host did not start{why}; every probe imported torch itself"
        warmed = f", {', '.join(self.warmed)} computed once" if self.warmed else ""
        return (
            f"{', '.join(self.imported)} imported once in {self.imported_s} s{warmed}; "
            f"{len(self._children)} probes forked from it"
        )

    def close(self) -> None:
        """End the host: closing its stdin makes it kill what it still runs and exit."""
        with contextlib.suppress(OSError):
            if self._process.stdin is not None:
                self._process.stdin.close()
        try:
            self._process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(OSError):
                os.killpg(self._process.pid, signal.SIGKILL)
            self._process.wait()


_current: ContextVar[ProbeHost | None] = ContextVar("dflashdoctor_probe_host", default=None)


def current_host(python: str) -> ProbeHost | None:
    """The host the caller opened with `hosting`, if it runs this interpreter."""
    host = _current.get()
    return host if host is not None and host.python == python else None


@contextlib.contextmanager
def hosting(python: str, env: dict[str, str], device: str = "auto") -> Iterator[ProbeHost | None]:
    """Within this block (and in threads started with its context), local probes of `python` are
    forked from one host. Where the host cannot start, probes run alone as before."""
    host = ProbeHost.open(python, env, device)
    token = _current.set(host)
    try:
        yield host
    finally:
        _current.reset(token)
        if host is not None:
            host.close()
