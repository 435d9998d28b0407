"""The nodes a gate runs on: a hostfile in the `host slots=N` form DeepSpeed and MPI read, or the
hosts given with `--ssh` one by one.

A line is `[user@]host[:port]` and optional `key=value` words: `slots` and `max_slots` (MPI's,
counted and shown), and `python=PATH`, a dflashdoctor word for a node whose interpreter lives
elsewhere. `#` starts a comment. Anything else is bad input naming the line: a gate that silently
skipped a node it could not read would pass a cluster it never saw.
"""

from __future__ import annotations

import os
import stat
import sys
from dataclasses import dataclass
from pathlib import Path

from dflashdoctor.errors import BadInput
from dflashdoctor.limits import count_problem
from dflashdoctor.remote import SshTarget

MAX_NODES = 1024
MAX_SLOTS = 4096
_MAX_BYTES = 1 << 20


@dataclass(frozen=True)
class Node:
    spec: str  # [user@]host[:port], as ssh is given it; also the node's name in the report
    slots: int | None = None
    python: str | None = None  # this node's interpreter, where it is not the gate's --python


def _node(words: list[str], where: str) -> Node:
    spec, *pairs = words
    try:
        SshTarget.parse(spec)
    except BadInput as exc:
        raise BadInput(f"{where}: {str(exc).removeprefix('--ssh ')}") from None
    values: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or key not in ("slots", "max_slots", "python") or not value:
            raise BadInput(f"{where}: {pair!r} is not slots=N, max_slots=N or python=PATH")
        if key in values:
            raise BadInput(f"{where}: {key} is given twice")
        values[key] = value
    slots = None
    for key in ("slots", "max_slots"):
        if key in values:
            number = int(values[key]) if values[key].isdigit() else values[key]
            problem = count_problem(number, f"{where}: {key}", 1, MAX_SLOTS)
            if problem:
                raise BadInput(problem)
    if "slots" in values:
        slots = int(values["slots"])
    return Node(spec=spec, slots=slots, python=values.get("python"))


def parse_hostfile(text: str, source: str) -> list[Node]:
    nodes: list[Node] = []
    seen: dict[str, int] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        node = _node(words, f"{source}:{number}")
        if node.spec in seen:
            raise BadInput(f"{source}:{number}: {node.spec} is listed already, at line {seen[node.spec]}")
        seen[node.spec] = number
        nodes.append(node)
        if len(nodes) > MAX_NODES:
            raise BadInput(f"{source}: more than {MAX_NODES} nodes")
    if not nodes:
        raise BadInput(f"{source} names no node")
    return nodes


def _read(path: str) -> tuple[bytes, str]:
    if path == "-":
        return sys.stdin.buffer.read(_MAX_BYTES + 1), "the hostfile on stdin"
    try:
        info = os.stat(path)
    except OSError as exc:
        raise BadInput(f"--hostfile {path}: {exc.strerror}") from None
    if not stat.S_ISREG(info.st_mode):  # a FIFO or a device would block the gate, a folder is no list
        raise BadInput(f"--hostfile {path} is not a regular file")
    try:
        with open(path, "rb") as handle:
            return handle.read(_MAX_BYTES + 1), path
    except OSError as exc:
        raise BadInput(f"--hostfile {path}: {exc.strerror}") from None


def read_hostfile(path: str | Path) -> list[Node]:
    """The nodes of a hostfile (`-`: standard input)."""
    data, source = _read(str(path))
    if len(data) > _MAX_BYTES:
        raise BadInput(f"{source} is over {_MAX_BYTES} bytes: not a hostfile")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadInput(f"{source} is not UTF-8 text (byte {exc.start})") from None
    return parse_hostfile(text, source)


def nodes_of(hostfile: str | Path | None, ssh: list[str]) -> list[Node]:
    """The hostfile's nodes, then each --ssh host not already among them."""
    nodes = read_hostfile(hostfile) if hostfile is not None else []
    listed = {node.spec for node in nodes}
    for spec in ssh:
        SshTarget.parse(spec)
        if spec not in listed:
            nodes.append(Node(spec=spec))
            listed.add(spec)
    return nodes
