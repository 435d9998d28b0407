"""One JSON-lines file of events per process, flushed at every write (a line, or a batch of
lines) so a killed process keeps everything it wrote. Writing never raises into the program: a
failure is counted and dropped."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Iterable
from typing import Any

from dflashdoctor.report_folder import open_append

_ENCODER = json.JSONEncoder(default=str)  # made once: json.dumps with an option makes one per call
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
        self.write_all(kind, [fields])

    def write_all(self, kind: str, records: Iterable[dict[str, Any]]) -> None:
        """Records of one kind in one write and one flush: a batch of dense kernels costs one system
        call, not one a line. A record that does not encode is counted and left out, not its batch."""
        now, pid = round(time.time(), 3), os.getpid()
        lines = []
        try:
            for fields in records:
                try:
                    lines.append(_ENCODER.encode({"t": now, "pid": pid, "rank": self.rank, "kind": kind, **fields}))
                except Exception:  # an odd value must not reach the training loop
                    self.failures += 1
        except Exception:  # nor a batch that failed to be made
            self.failures += 1
        if not lines:
            return
        try:
            handle = self._handle()
            with self._lock:
                handle.write("\n".join(lines) + "\n")
                handle.flush()
        except Exception:  # a full disk likewise
            self.failures += len(lines)
