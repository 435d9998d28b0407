"""One JSON-lines file of events per process, flushed line by line so a killed process keeps
everything it wrote. Writing never raises into the program: a failure is counted and dropped."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from typing import Any

from dflashdoctor.report_folder import open_append

RANK_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK")


def rank_of(environ: dict[str, str] | os._Environ[str]) -> int | None:
    value = environ.get("RANK")
    return int(value) if value is not None and value.isdigit() else None


class EventLog:
    def __init__(self, folder: str) -> None:
        self.folder = folder
        self.failures = 0
        # Re-entrant: the SIGTERM handler writes from the main thread, which may be inside a write.
        self._lock = threading.RLock()
        self._pid = -1
        self._file: Any = None
        self.rank = rank_of(os.environ)

    def _handle(self) -> Any:
        """The file of this process; a forked child (a DataLoader worker) gets its own."""
        pid = os.getpid()
        if pid != self._pid:
            self._pid = pid
            self._lock = threading.RLock()
            path = os.path.join(self.folder, f"{socket.gethostname()}-{pid}.jsonl")
            # kept open for the process; made O_EXCL|O_NOFOLLOW, never through a name planted first
            self._file = os.fdopen(open_append(path), "a", encoding="utf-8")
        return self._file

    def write(self, kind: str, **fields: Any) -> None:
        record = {"t": round(time.time(), 3), "pid": os.getpid(), "rank": self.rank, "kind": kind, **fields}
        try:
            line = json.dumps(record, default=str) + "\n"
            handle = self._handle()
            with self._lock:
                handle.write(line)
                handle.flush()
        except Exception:  # a full disk or an odd value must not reach the training loop
            self.failures += 1
