"""How the doctor tells an instrumented process what to do: environment variables, read once.

Shared by both sides (standard library only). The variables pass to every child process the
command starts, which is what carries the instrumentation into torchrun workers.
"""

from __future__ import annotations

import json
import os
import signal
from dataclasses import asdict, dataclass

EVENTS_DIR = "DFLASHDOCTOR_RUN_EVENTS"
SETTINGS = "DFLASHDOCTOR_RUN_SETTINGS"
VERSION = "DFLASHDOCTOR_RUN_VERSION"  # the bootstrap loads an agent of exactly this version
# Snapshots taken as a process ends: they hold everything, so nothing logged before them is added.
FINAL_SNAPSHOTS = ("exit", "exception", "steps-limit", "terminated", "oom")
PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # as imported (maybe via a link)
# faulthandler dumps every thread's stack on this signal when py-spy is not there; a real-time
# signal, which no training framework claims.
STACK_SIGNAL = signal.SIGRTMIN + 7 if hasattr(signal, "SIGRTMIN") else signal.SIGUSR2


@dataclass
class RunSettings:
    steps: int | None = None  # stop each process after this many optimizer steps
    memory_snapshot: bool = False  # record CUDA allocation history; dump it on out-of-memory
    strict: bool = False  # dynamo's silent fallbacks and dense flex kernels raise instead
    last_calls: int = 32  # attention calls kept for out-of-memory forensics

    def to_env(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_env(cls, environ: dict[str, str] | os._Environ[str]) -> RunSettings:
        try:
            data = json.loads(environ.get(SETTINGS) or "{}")
            return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})
        except (ValueError, TypeError):
            return cls()
