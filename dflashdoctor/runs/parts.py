"""A run on several nodes: which node this `dflashdoctor run` is, where its part of the report goes,
and finding the other nodes' parts in the shared report folder.

Every node runs `dflashdoctor run --report-dir SHARED/DIR -- torchrun ...` (or under `srun`). The
node and the number of nodes come from what the launcher is told: torchrun's `--nnodes` and
`--node-rank` (or their `PET_` variables), else Slurm's `SLURM_NNODES` and `SLURM_NODEID`. Each
part is a folder `node<rank>-<host>` holding a whole run report; `node.json` in it is written at the
start, so a part whose report never came is seen as unfinished, not as absent.
"""

from __future__ import annotations

import json
import os
import re
import socket
import stat
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from dflashdoctor.placed_files import MIB, read_placed
from dflashdoctor.redaction import redact_argv
from dflashdoctor.report_folder import ReportFolder
from dflashdoctor.safe_fs import closing, open_child_folder, refused_because, trusted_uids, user_name
from dflashdoctor.safe_paths import open_folder

PART_FILE = "node.json"
_PART_FILE_BYTES = 64 * MIB  # node.json is bytes, a report.json a few megabytes
_LAUNCHERS = ("torchrun", "torch.distributed.run", "torch.distributed.launch")
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")
_MAX_NODES = 65536


@dataclass(frozen=True)
class NodePart:
    nnodes: int
    node_rank: int | None
    host: str

    @property
    def folder(self) -> str:
        host = _UNSAFE.sub("_", self.host)[:64] or "host"
        rank = f"node{self.node_rank}" if self.node_rank is not None else f"node-pid{os.getpid()}"
        return f"{rank}-{host}"


def _flag(command: list[str], *names: str) -> str | None:
    for i, word in enumerate(command):
        for name in names:
            if word == name and i + 1 < len(command):
                return command[i + 1]
            if word.startswith(f"{name}="):
                return word.split("=", 1)[1]
    return None


def _count(text: str | None) -> int | None:
    """`2`, or the most of an elastic `1:4`."""
    if text is None:
        return None
    last = text.split(":")[-1]
    return int(last) if last.isdigit() else None


def node_part(command: list[str], environ: Mapping[str, str]) -> NodePart | None:
    """This node's part of a run on more than one node; None for a run on one."""
    launched = any(Path(word).name in _LAUNCHERS or word in _LAUNCHERS for word in command[:4])
    nnodes = rank = None
    if launched:
        nnodes = _count(_flag(command, "--nnodes") or environ.get("PET_NNODES"))
        rank = _count(_flag(command, "--node-rank", "--node_rank") or environ.get("PET_NODE_RANK"))
    if nnodes is None:
        nnodes = _count(environ.get("SLURM_NNODES") or environ.get("SLURM_JOB_NUM_NODES"))
        rank = _count(environ.get("SLURM_NODEID"))
    if nnodes is None or nnodes < 2:
        return None
    return NodePart(nnodes=nnodes, node_rank=rank, host=socket.gethostname())


def write_part(folder: Path, part: NodePart, command: list[str]) -> None:
    record = {**asdict(part), "command": redact_argv(command), "started": time.time(), "pid": os.getpid()}
    with ReportFolder.open(folder) as opened:
        opened.write(PART_FILE, json.dumps(record))


@dataclass
class FoundPart:
    folder: Path
    record: dict[str, Any]  # node.json
    report: dict[str, Any] | None  # report.json, once the node finished
    refused: str | None = None  # why nothing of it is believed: whose it is, what is there

    @property
    def name(self) -> str:
        return self.folder.name


class PartRefused(Exception):
    """A part folder, or a file in it, that may not be read as a node's: why, in words."""


class SharedFolder:
    """The run's shared report folder, open: its parts are read through descriptors, never by path.

    Every node writes there, so another local user who can write there too could place a part, or
    an `events` link into root's own private run, whose text would then be merged into a report others
    read. So nothing is reached through a link (a link to the folder itself only when this user or
    root made it: safe_paths.py), and a part, its `events` and every file read from them must belong
    to whoever owns the shared folder, to this user or to root (`owners`)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.fd = open_folder(directory)
        self.owners = trusted_uids() | {os.fstat(self.fd).st_uid}

    def __enter__(self) -> SharedFolder:
        return self

    def __exit__(self, *_: object) -> None:
        os.close(self.fd)

    def names(self) -> list[str]:
        return sorted(os.listdir(self.fd))

    def folder(self, parent_fd: int, name: str, what: str) -> int:
        """The folder `name` in `parent_fd`, if it is a folder of one of `owners` that no one else
        can write into; PartRefused otherwise (FileNotFoundError where there is none)."""
        try:
            fd = open_child_folder(parent_fd, name)
        except OSError as exc:
            if isinstance(exc, FileNotFoundError):
                raise
            raise PartRefused(f"its {what} is {refused_because(exc)}") from None
        info = os.fstat(fd)
        reason = None
        if info.st_uid not in self.owners:
            reason = f"its {what} belongs to {user_name(info.st_uid)}, not to who writes {self.directory} or root"
        elif info.st_mode & 0o022:
            reason = f"its {what} can be written by others (mode {stat.S_IMODE(info.st_mode):o})"
        if reason:
            os.close(fd)
            raise PartRefused(reason)
        return fd

    def read(self, folder_fd: int, name: str, max_bytes: int) -> bytes:
        """A file of a part: a regular file of one of `owners`, never through a link."""
        return read_placed(name, max_bytes, dir_fd=folder_fd, owners=self.owners)


def _json(shared: SharedFolder, folder_fd: int, name: str) -> dict[str, Any] | None:
    """A part's JSON file, read as a file another node placed in a shared folder (placed_files.py)."""
    try:
        data = json.loads(shared.read(folder_fd, name, _PART_FILE_BYTES))
    except (OSError, ValueError, RecursionError):  # absent, still being written, or not a file to read
        return None
    return data if isinstance(data, dict) else None


def _whole(value: Any, low: int, high: int) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and low <= value <= high else None


def _record(data: dict[str, Any]) -> dict[str, Any]:
    """A node.json as this version writes it, whoever wrote the file: the shared folder is writable by
    every node, so a value of another type is dropped rather than trusted."""
    command = data.get("command")
    return {
        "nnodes": _whole(data.get("nnodes"), 1, _MAX_NODES),
        "node_rank": _whole(data.get("node_rank"), 0, _MAX_NODES),
        "host": str(data.get("host", "?"))[:256],
        "command": [str(word)[:4096] for word in command[:4096]] if isinstance(command, list) else [],
        "pid": _whole(data.get("pid"), 0, 2**31),
    }


def find_parts(directory: Path) -> list[FoundPart]:
    """Every node's part in the shared folder, by node rank; finished or not; a part that may not
    be believed (SharedFolder says why) is there with `refused` and nothing read from it."""
    found = []
    with SharedFolder(directory) as shared:
        for name in shared.names():
            try:
                fd = shared.folder(shared.fd, name, "folder")
            except FileNotFoundError:
                continue
            except PartRefused as exc:
                if _has_part_file(shared.fd, name):
                    found.append(FoundPart(directory / name, _record({}), None, refused=str(exc)))
                continue
            with closing(fd):
                record = _json(shared, fd, PART_FILE)
                if record is not None:
                    found.append(FoundPart(directory / name, _record(record), _json(shared, fd, "report.json")))
    return sorted(found, key=lambda p: (p.record.get("node_rank") is None, p.record.get("node_rank") or 0, p.name))


def _has_part_file(folder_fd: int, name: str) -> bool:
    """Whether a refused entry looks like a part (a folder, or a link, with a node.json in it): such
    an entry is named in the report; anything else in the shared folder is not a part at all."""
    try:
        fd = os.open(name, os.O_PATH | os.O_CLOEXEC, dir_fd=folder_fd)
    except OSError:
        return False
    with closing(fd):
        try:
            os.stat(PART_FILE, dir_fd=fd, follow_symlinks=False)
        except OSError:
            return False
    return True


def wait_for_parts(directory: Path, nnodes: int, wait_s: float) -> list[FoundPart]:
    """The parts, once `nnodes` of them have finished or `wait_s` has passed."""
    deadline = time.monotonic() + wait_s
    while True:
        parts = find_parts(directory)
        if sum(1 for p in parts if p.report is not None) >= nnodes or time.monotonic() >= deadline:
            return parts
        time.sleep(0.5)
