"""Whether a process still runs (one that left a temporary file in a cache, and so may still be
writing it, or one of a run's processes), killing a probe with everything it started, the tail
of what it wrote, and the process tree as /proc records it. Standard library only: the probe host
and `run`'s launcher use it too."""

from __future__ import annotations

import contextlib
import os
import signal
from dataclasses import dataclass
from pathlib import Path


def pid_alive(pid: int) -> bool:
    """True when `pid` exists on this machine. A cache shared across machines can hold another
    machine's pids: those read as gone, which is what they are to this machine."""
    if pid <= 0 or pid >= 1 << 31:  # a 20-digit "pid" in a crafted file name is no process (os.kill overflows)
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    except OSError:
        return False
    return True


def kill_with_group(pid: int) -> None:
    """SIGKILL to a probe and its process group. The probe first: one just forked by the probe host
    may not have made its own group yet (it calls setsid as it starts), and then has no children
    either; a probe already gone is no error."""
    for kill in (os.kill, os.killpg):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            kill(pid, signal.SIGKILL)


def output_tail(path: Path, max_bytes: int) -> str:
    """The last `max_bytes` of a child's captured output, read from there: a probe that wrote
    gigabytes to stderr costs the doctor `max_bytes`, not the file (which stays on disk)."""
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - max_bytes))
            data = handle.read(max_bytes)
    except OSError:
        return ""
    return data.decode("utf-8", errors="replace")


@dataclass(frozen=True)
class Entry:
    """One process as the kernel records it in /proc/PID/stat: what links it to the processes that
    started it, which no environment variable it drops or user it becomes can change."""

    pid: int
    running: bool  # not a zombie: one holds nothing but its pid until its parent reaps it
    parent: int
    group: int
    session: int


def stat_fields(pid: int) -> list[bytes] | None:
    """/proc/PID/stat after the command name (which may hold spaces and parentheses)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            return handle.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None


def process_table() -> dict[int, Entry]:
    """Every process on this machine, read once; empty where there is no /proc (not Linux)."""
    if not os.path.isdir("/proc"):
        return {}
    table = {}
    for name in os.listdir("/proc"):
        fields = stat_fields(int(name)) if name.isdigit() else None
        if fields is not None and len(fields) > 3:
            table[int(name)] = Entry(int(name), fields[0] != b"Z", int(fields[1]), int(fields[2]), int(fields[3]))
    return table


def descendants(root: int, table: dict[int, Entry]) -> set[int]:
    """The live processes below `root` by parent links. Below a child subreaper (runs/launcher.py)
    that is every process it started, however it daemonized: an orphan is reparented to its nearest
    subreaper ancestor, and only an ancestor; no process can make itself another's child."""
    children: dict[int, list[int]] = {}
    for entry in table.values():
        children.setdefault(entry.parent, []).append(entry.pid)
    found: set[int] = set()
    queue = [root]
    while queue:
        for pid in children.get(queue.pop(), ()):
            if pid not in found and pid != root:
                found.add(pid)
                queue.append(pid)
    return {pid for pid in found if table[pid].running}
