"""Judges a run across nodes: every node's part judged as `run` judges one node, under the names
torch.distributed gave its processes (node, RANK, LOCAL_RANK), and a section over them all: which
nodes reported, which ranks were seen, and which part never came.
"""

from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from dflashdoctor.budgets import Budgets
from dflashdoctor.codes import finding
from dflashdoctor.judges.base import Judge
from dflashdoctor.judges.run import judge as judge_run
from dflashdoctor.report import CheckStatus, ProbeResult, Table
from dflashdoctor.runs.events import ProcessLog
from dflashdoctor.runs.observations import RunObservations


@dataclass
class RunPart:
    """One node's part: its node.json, and its observations once it finished (None: it did not, or
    `reported` says it wrote a report whose observations cannot be read)."""

    name: str
    record: dict[str, Any]
    observations: RunObservations | None = None
    reported: bool = False
    refused: str | None = None  # why it was not read: another user's, a link (runs/parts.SharedFolder)
    sections: list[ProbeResult] = field(default_factory=list)

    def damage(self) -> str | None:
        """Why this part cannot be believed as a node's run: refused, or holding numbers that no run
        of torch.distributed has (a world size of three billion, `²`): the merge must not act on them."""
        if self.refused:
            return self.refused
        for log in self.observations.processes if self.observations else []:
            if log.rank is not None and not 0 <= log.rank < MAX_WORLD:
                return f"process {log.pid} says it is rank {log.rank}"
            for name in RANK_VARIABLES:
                value = _env(log).get(name)
                if value is not None and _rank_number(value) is None:
                    return f"process {log.pid} has {name}={value[:40]!r}, not a number of ranks up to {MAX_WORLD}"
        return None

    @property
    def node_rank(self) -> int | None:
        rank = self.record.get("node_rank")
        return rank if isinstance(rank, int) else None


_NAMED = 8  # parts named in a finding's words; its evidence keeps up to 64
MAX_WORLD = 1 << 20  # more ranks than any job has run; a larger number in a part is damage
RANK_VARIABLES = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK")


def _env(log: ProcessLog) -> dict[str, str]:
    return log.start["env"] if log.start else {}


def _rank_number(text: str) -> int | None:
    """A rank or world size as torch.distributed sets it: ASCII digits, below MAX_WORLD (`²` and
    a 5,000-digit value are neither: int() would take the first and refuse the second)."""
    if not (0 < len(text) <= 7 and text.isascii() and text.isdigit()):
        return None
    number = int(text)
    return number if number <= MAX_WORLD else None


def rank_name(part: RunPart, log: ProcessLog) -> str:
    """A process as torch.distributed placed it: its node (GROUP_RANK, else the node's own rank),
    its global RANK and its LOCAL_RANK."""
    env = _env(log)
    node = env.get("GROUP_RANK") or (str(part.node_rank) if part.node_rank is not None else part.name)
    if log.rank is None:
        return f"node {node}: {log.label}"
    local = f" (local rank {env['LOCAL_RANK']})" if "LOCAL_RANK" in env else ""
    return f"node {node}: rank {log.rank}{local}"


def judge_part(part: RunPart) -> None:
    """The part's own sections, named by node and rank (none for a damaged part)."""
    if part.observations is None or part.damage():
        return
    by_label = {log.label: log for log in part.observations.processes}
    sections = judge_run(part.observations, Budgets())
    sections[0].probe = f"{part.name}: run"
    for section in sections[1:]:
        log = by_label.get(section.probe)
        section.probe = rank_name(part, log) if log is not None else f"{part.name}: {section.probe}"
    part.sections = sections


def _why_missing(part: RunPart) -> str:
    if part.reported:
        return "wrote a report, but its observations.json cannot be read"
    return "started, but wrote no report"


_NODE_RANK_FLAGS = ("--node-rank", "--node_rank")


def _one_run(command: list[str]) -> tuple[str, ...]:
    """A node's command with its own node rank taken out: the same for every node of one run."""
    kept: list[str] = []
    skip = False
    for word in command:
        if skip:
            skip = False
        elif word in _NODE_RANK_FLAGS:
            skip = True
        elif not word.startswith(tuple(f"{flag}=" for flag in _NODE_RANK_FLAGS)):
            kept.append(word)
    return tuple(kept)


class RunNodesJudge(Judge):
    def __init__(self, parts: list[RunPart]) -> None:
        super().__init__("nodes", Budgets())
        self.parts = parts

    def judge(self) -> ProbeResult:
        expected = max((p.record.get("nnodes") or 0 for p in self.parts), default=0)
        rows: list[list[str]] = []
        believed = [part for part in self.parts if not part.damage()]
        for part in believed:
            self._part(part, rows)
        self._damaged()
        self._missing(expected)
        self._mixed()
        self._ranks()
        self.tables.append(
            Table(
                title="ranks",
                columns=["node", "host", "rank", "local rank", "world size", "pid", "verdict"],
                rows=rows,
            )
        )
        self.subject = f"{len(self.parts)} of {expected} nodes"
        self.measurements.update(expected_nodes=expected, parts=[p.name for p in self.parts])
        return self.result()

    def _part(self, part: RunPart, rows: list[list[str]]) -> None:
        host = str(part.record.get("host", "?"))
        if part.observations is None:
            return
        worst: CheckStatus = "fail" if any(s.status in ("fail", "error") for s in part.sections) else "pass"
        code = part.observations.outcome.returncode
        ranks = sorted(log.rank for log in part.observations.processes if log.rank is not None)
        self._check(part.name, worst, f"{host}: ranks {ranks or 'none'}, the command exited {code}")
        verdicts = {s.probe: s.status for s in part.sections}
        for log in part.observations.processes:
            if log.rank is None:
                continue
            env = _env(log)
            name = rank_name(part, log)
            node = name.split(":")[0].removeprefix("node ")
            rows.append(
                [
                    node,
                    host,
                    str(log.rank),
                    env.get("LOCAL_RANK", "?"),
                    env.get("WORLD_SIZE", "?"),
                    str(log.pid),
                    verdicts.get(name, "pass"),
                ]
            )

    def _damaged(self) -> None:
        damaged = [(part, part.damage()) for part in self.parts if part.damage()]
        for part, why in damaged:
            self._check(part.name, "fail", f"not read: {why}", "node-part-damaged")
        if damaged:
            self.findings.append(
                finding(
                    "node-part-damaged",
                    f"{len(damaged)} node part(s) in this folder cannot be believed: "
                    + "; ".join(f"{part.name}: {why}" for part, why in damaged[:3]),
                    detail="Nothing of such a part is in this report: the shared folder may hold another "
                    "user's files, or a part no run of this tool wrote.",
                    evidence={"parts": [{"part": part.name, "why": why} for part, why in damaged[:64]]},
                    fix="Look at who wrote that part (ls -l); give each run a report folder only its nodes write.",
                )
            )

    def _missing(self, expected: int) -> None:
        unfinished = [p for p in self.parts if p.observations is None and not p.damage()]
        absent = max(0, expected - len(self.parts))
        for part in unfinished:
            self._check(part.name, "fail", f"{part.record.get('host', '?')}: {_why_missing(part)}", "node-missing")
        if not unfinished and not absent:
            return
        # a line per part, the first few only: the finding is shown at every check that names it
        said = [f"{p.name} {_why_missing(p)}" for p in unfinished[:_NAMED]]
        said += [f"and {len(unfinished) - _NAMED} more"] if len(unfinished) > _NAMED else []
        if absent:
            said.append(f"{absent} of {expected} nodes never started their part")
        self.findings.append(
            finding(
                "node-missing",
                f"{len(unfinished) + absent} of {expected} nodes' parts of the run are missing",
                detail="; ".join(said) + ". What they saw is not in this report.",
                evidence={"expected": expected, "unfinished": [p.name for p in unfinished[:64]], "absent": absent},
                fix="Look at that node's own output; `dflashdoctor merge DIR` merges again once its part is there.",
            )
        )

    def _mixed(self) -> None:
        """Parts that cannot be one run: two for one node rank, or parts that disagree on the number
        of nodes or on the command (a shared folder reused by another run, or one node started twice)."""
        parts = [p for p in self.parts if not p.refused]  # a refused part's record was never read
        ranks = Counter(rank for p in parts if (rank := p.record.get("node_rank")) is not None)
        twice = sorted(rank for rank, n in ranks.items() if n > 1)
        sizes = sorted({nodes for p in parts if (nodes := p.record.get("nnodes")) is not None})
        commands = {_one_run(p.record.get("command") or []) for p in parts}
        said = [f"node rank {r} has {ranks[r]} parts" for r in twice]
        said += [f"the parts say {' or '.join(map(str, sizes))} nodes"] if len(sizes) > 1 else []
        said += [f"the parts ran {len(commands)} different commands"] if len(commands) > 1 else []
        if not said:
            return
        self.findings.append(
            finding(
                "node-parts-mixed",
                f"The parts in this folder are not one run: {'; '.join(said)}",
                detail="Merged as they are, one run's ranks would be judged with another's, or a node counted twice.",
                evidence={"parts": [{"part": p.name, **p.record} for p in self.parts][:64]},
                fix="Give every run a report folder of its own (`--report-dir`), then merge that folder.",
            )
        )
        self._check("parts", "fail", "; ".join(said), "node-parts-mixed")

    def _ranks(self) -> None:
        logs = [
            log
            for p in self.parts
            if p.observations and not p.damage()
            for log in p.observations.processes
            if log.rank is not None
        ]
        world = {given for log in logs if (given := _env(log).get("WORLD_SIZE")) is not None}
        seen = {log.rank for log in logs if log.rank is not None}
        size = _rank_number(next(iter(world))) if len(world) == 1 else None
        if size is None:
            self._check("ranks", "info", f"{len(seen)} ranks seen")
            return
        missing_count = size - sum(1 for rank in seen if 0 <= rank < size)
        missing = list(itertools.islice((rank for rank in range(size) if rank not in seen), 32))
        said = f"; missing {missing}{' ...' if missing_count > len(missing) else ''}" if missing else ""
        self._check("ranks", "warn" if missing else "pass", f"{len(seen)} of world size {size}{said}")


def judge(parts: list[RunPart]) -> list[ProbeResult]:
    """The overview over all nodes, then each node's sections (its run overview, then its ranks)."""
    for part in parts:
        judge_part(part)
    return [RunNodesJudge(parts).judge(), *(s for p in parts for s in p.sections)]
