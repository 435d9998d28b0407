"""The agent of one instrumented process: what it is, how it ends, whether it still moves.

Started by the bootstrap before the program's first line. It writes a `start` event, records every
uncaught exception (main thread and other threads), arms faulthandler so the doctor can ask for
every thread's stack, samples the threads' stacks to tell progress from a hang, and hands torch
instrumentation to `torch_instruments` when the program imports torch. Every hook chains to what
was there before, and a failure inside the agent becomes an `agent-error` event, never the
program's problem.
"""

from __future__ import annotations

import atexit
import faulthandler
import os
import signal
import sys
import sysconfig
import threading
import time
import traceback
from types import FrameType, TracebackType
from typing import Any

from dflashdoctor.agent.config import EVENTS_DIR, PACKAGE_DIR, STACK_SIGNAL, RunSettings
from dflashdoctor.agent.events import RANK_VARIABLES, EventLog
from dflashdoctor.agent.post_import import when_imported
from dflashdoctor.redaction import redact_argv, redact_text
from dflashdoctor.report_folder import open_append

_SAMPLE_S = 1.0  # how often the sampler looks at the threads' stacks
_PROGRESS_EVERY_S = 2.0  # at most one progress event this often
_TRACEBACK_CHARS = 6000


# The instrumentation's own frames (the autotuner guard wraps triton's run) are never the user's either.
_INSTRUMENTATION = (os.path.join(PACKAGE_DIR, "agent"), os.path.join(PACKAGE_DIR, "hooks"))
_LIBRARY_MARKERS = ("site-packages", "dist-packages", sysconfig.get_paths()["stdlib"], *_INSTRUMENTATION)


def is_user_file(filename: str) -> bool:
    """Not installed libraries, not the standard library, not generated code."""
    return not filename.startswith("<") and not any(marker in filename for marker in _LIBRARY_MARKERS)


def _stack_key(sampler: int) -> tuple[tuple[Any, ...], int]:
    """What changes when any thread runs Python: each thread's innermost code object and line. The
    frames are let go here: a frame kept alive keeps its locals (activations) alive with it."""
    frames = sys._current_frames()
    frames.pop(sampler, None)
    key = tuple(sorted((ident, id(f.f_code), f.f_lineno) for ident, f in frames.items()))
    return key, len(frames)


class ProcessAgent:
    def __init__(self, folder: str, settings: RunSettings) -> None:
        self.log = EventLog(folder)
        self.settings = settings
        self.folder = folder
        self.torch: Any = None  # the TorchInstruments, once torch is imported
        self.ending = "exit"
        self._stacks_file: Any = None

    def start(self) -> None:
        self.log.write(
            "start",
            argv=redact_argv(list(getattr(sys, "orig_argv", sys.argv))),  # `python -m x` has no argv[0] yet
            executable=sys.executable,
            ppid=os.getppid(),
            cwd=os.getcwd(),
            python=sys.version.split()[0],
            env={k: os.environ[k] for k in RANK_VARIABLES if k in os.environ},
        )
        self._chain_excepthooks()
        self._arm_stack_dump()
        self._note_termination()
        atexit.register(self._at_exit)
        threading.Thread(target=self._sample, name="dflashdoctor-sampler", daemon=True).start()
        when_imported("torch", self._torch_imported)

    def safely(self, what: str, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except Exception as exc:
            self.log.write("agent-error", what=what, error=redact_text(f"{type(exc).__name__}: {exc}"))
            return None

    def _torch_imported(self, module: Any) -> None:
        """Runs inside the program's `import torch`: nothing here may raise into it."""

        def install() -> Any:
            from dflashdoctor.agent.torch_instruments import TorchInstruments

            return TorchInstruments(self).install()

        self.torch = self.safely("torch instrumentation", install)

    def _chain_excepthooks(self) -> None:
        previous, previous_thread = sys.excepthook, threading.excepthook

        def excepthook(kind: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
            self.safely("excepthook", self.record_exception, exc, tb, threading.current_thread().name)
            previous(kind, exc, tb)

        def thread_excepthook(args: Any) -> None:
            name = args.thread.name if args.thread is not None else "?"
            if args.exc_value is not None:
                self.safely("excepthook", self.record_exception, args.exc_value, args.exc_traceback, name)
            previous_thread(args)

        sys.excepthook, threading.excepthook = excepthook, thread_excepthook

    def record_exception(self, exc: BaseException, tb: TracebackType | None, thread: str) -> None:
        frames = traceback.extract_tb(tb)
        raised = frames[-1] if frames else None
        last = next((f for f in reversed(frames) if is_user_file(f.filename)), raised)
        module = self.torch.module_of(tb) if self.torch is not None else None
        oom = type(exc).__name__ == "OutOfMemoryError"
        self.log.write(
            "exception",
            thread=thread,
            type=type(exc).__name__,
            # redacted, then cut: a cut first could leave part of a secret that no rule knows any more
            message=redact_text(str(exc))[:2000],
            traceback=redact_text("".join(traceback.format_exception(exc)))[-_TRACEBACK_CHARS:],
            where={"file": last.filename, "line": last.lineno, "function": last.name} if last else None,
            raised_at=f"{raised.filename}:{raised.lineno} in {raised.name}" if raised else None,
            module=module,
            oom=oom,
        )
        if self.torch is not None:
            self.safely("snapshot", self.torch.snapshot, "exception")

    def _arm_stack_dump(self) -> None:
        """The doctor's fallback when py-spy is missing: this signal makes faulthandler write every
        thread's stack from C, which works even while the program is stuck on a lock."""
        path = os.path.join(self.folder, f"stacks-{os.getpid()}.txt")
        # faulthandler writes to it until exit; made O_EXCL|O_NOFOLLOW, never through a planted name
        self._stacks_file = os.fdopen(open_append(path), "a")
        if signal.getsignal(STACK_SIGNAL) in (signal.SIG_DFL, None):
            faulthandler.register(STACK_SIGNAL, file=self._stacks_file, all_threads=True, chain=False)

    def _note_termination(self) -> None:
        """SIGTERM (torchrun stopping its workers, the doctor stopping a hung run) ends a process
        without atexit: take the snapshot first, then die of the signal as before."""
        if threading.current_thread() is not threading.main_thread():
            return
        if signal.getsignal(signal.SIGTERM) != signal.SIG_DFL:
            return

        def terminated(signum: int, _frame: FrameType | None) -> None:
            self.ending = "terminated"
            self._at_exit()
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

        signal.signal(signal.SIGTERM, terminated)

    def _sample(self) -> None:
        """Progress is any thread running Python: the innermost frame of some thread changed."""
        last_key: tuple[Any, ...] = ()
        last_sent = 0.0
        while True:
            time.sleep(_SAMPLE_S)
            try:
                key, threads = _stack_key(threading.get_ident())  # holds no frame past this line
                now = time.monotonic()
                if key != last_key and now - last_sent >= _PROGRESS_EVERY_S:
                    self.log.write("progress", threads=threads)
                    last_sent = now
                last_key = key
            except Exception:  # a sampler that fails only stops reporting progress
                return

    def _at_exit(self) -> None:
        if self.torch is not None:
            self.safely("snapshot", self.torch.snapshot, self.ending)
        self.log.write("exit", ending=self.ending, event_write_failures=self.log.failures)


def start_from_environment() -> ProcessAgent | None:
    folder = os.environ.get(EVENTS_DIR)
    if not folder or not os.path.isdir(folder):
        return None
    agent = ProcessAgent(folder, RunSettings.from_env(os.environ))
    agent.start()
    return agent
