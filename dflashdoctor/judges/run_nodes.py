"""Judges a run across nodes: every node's part judged as `run` judges one node, under the names
torch.distributed gave its processes (node, RANK, LOCAL_RANK), and a section over them all: which
nodes reported, which ranks were seen, and which part never came.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from dflashdoctor.budgets import Budgets
from dflashdoctor.codes import finding
from dflashdoctor.judges.base import Judge
from dflashdoctor.judges.run import judge as judge_run
from dflashdoctor.report import ProbeResult, Table
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
    sections: list[ProbeResult] = field(default_factory=list)

    @property
    def node_rank(self) -> int | None:
        rank = self.record.get("node_rank")
        return rank if isinstance(rank, int) else None


def _env(log: ProcessLog) -> dict[str, str]:
    return log.start["env"] if log.start else {}


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
    """The part's own sections, named by node and rank."""
    if part.observations is None:
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
        rows = []
        for part in self.parts:
            self._part(part, rows)
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
        worst = "fail" if any(s.status in ("fail", "error") for s in part.sections) else "pass"
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

    def _missing(self, expected: int) -> None:
        unfinished = [p for p in self.parts if p.observations is None]
        absent = max(0, expected - len(self.parts))
        for part in unfinished:
            self._check(part.name, "fail", f"{part.record.get('host', '?')}: {_why_missing(part)}", "node-missing")
        if not unfinished and not absent:
            return
        said = [f"{p.name} {_why_missing(p)}" for p in unfinished]
        if absent:
            said.append(f"{absent} of {expected} nodes never started their part")
        self.findings.append(
            finding(
                "node-missing",
                f"{len(unfinished) + absent} of {expected} nodes' parts of the run are missing",
                detail="; ".join(said) + ". What they saw is not in this report.",
                evidence={"expected": expected, "unfinished": [p.name for p in unfinished], "absent": absent},
                fix="Look at that node's own output; `dflashdoctor merge DIR` merges again once its part is there.",
            )
        )

    def _mixed(self) -> None:
        """Parts that cannot be one run: two for one node rank, or parts that disagree on the number
        of nodes or on the command (a shared folder reused by another run, or one node started twice)."""
        ranks = Counter(p.record.get("node_rank") for p in self.parts if p.record.get("node_rank") is not None)
        twice = sorted(rank for rank, n in ranks.items() if n > 1)
        sizes = sorted({p.record.get("nnodes") for p in self.parts} - {None})
        commands = {_one_run(p.record.get("command") or []) for p in self.parts}
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
        logs = [log for p in self.parts if p.observations for log in p.observations.processes if log.rank is not None]
        world = {_env(log).get("WORLD_SIZE") for log in logs} - {None}
        seen = sorted({log.rank for log in logs if log.rank is not None})
        size = int(next(iter(world))) if len(world) == 1 and next(iter(world)).isdigit() else None
        if size is None:
            self._check("ranks", "info", f"{len(seen)} ranks seen")
            return
        missing = sorted(set(range(size)) - set(seen))
        status = "warn" if missing else "pass"
        self._check("ranks", status, f"{len(seen)} of world size {size}" + (f"; missing {missing}" if missing else ""))


def judge(parts: list[RunPart]) -> list[ProbeResult]:
    """The overview over all nodes, then each node's sections (its run overview, then its ranks)."""
    for part in parts:
        judge_part(part)
    return [RunNodesJudge(parts).judge(), *(s for p in parts for s in p.sections)]
