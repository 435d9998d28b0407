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
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from dflashdoctor.placed_files import MIB, read_placed
from dflashdoctor.redaction import redact_argv
from dflashdoctor.report_folder import ReportFolder

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

    @property
    def name(self) -> str:
        return self.folder.name


def _json(path: Path) -> dict[str, Any] | None:
    """A part's JSON file, read as a file another node placed in a shared folder (placed_files.py)."""
    try:
        data = json.loads(read_placed(path, _PART_FILE_BYTES))
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
        "host": str(data.get("host", "?")),
        "command": [str(word) for word in command] if isinstance(command, list) else [],
        "pid": _whole(data.get("pid"), 0, 2**31),
    }


def find_parts(directory: Path) -> list[FoundPart]:
    """Every node's part in the shared folder, by node rank; finished or not."""
    found = []
    for folder in sorted(p for p in directory.iterdir() if p.is_dir() and not p.is_symlink()):
        record = _json(folder / PART_FILE)
        if record is not None:
            found.append(FoundPart(folder, _record(record), _json(folder / "report.json")))
    return sorted(found, key=lambda p: (p.record.get("node_rank") is None, p.record.get("node_rank") or 0, p.name))


def wait_for_parts(directory: Path, nnodes: int, wait_s: float) -> list[FoundPart]:
    """The parts, once `nnodes` of them have finished or `wait_s` has passed."""
    deadline = time.monotonic() + wait_s
    while True:
        parts = find_parts(directory)
        if sum(1 for p in parts if p.report is not None) >= nnodes or time.monotonic() >= deadline:
            return parts
        time.sleep(0.5)
