"""The report model: one serialisable session object that every renderer draws from.

Standard library only, because the probed side builds parts of it too. The schema is
`dflashdoctor.report/1`; parts added since are optional on ProbeResult: `checks` (one line per question the
probe answered, which the terminal view lists first), `comparisons` (numbers people compare,
which the HTML view draws as bar charts), `tables` (rows such as call sites), `subject` and `plots`
(values per step, drawn as lines). A
report written by an older version reads back with them empty (`dflashdoctor show` fills `tables`
and `subject` from its measurements).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from dflashdoctor.causes import causes

SCHEMA = "dflashdoctor.report/1"
OBSERVATIONS_SCHEMA = "dflashdoctor.observations/1"

Severity = Literal["error", "warning", "info"]
ProbeStatus = Literal["pass", "fail", "error", "skipped"]
CheckStatus = Literal["pass", "fail", "warn", "info", "skip"]
Verdict = Literal["pass", "fail", "error"]

EXIT_OK = 0
EXIT_FINDINGS = 1
EXIT_USAGE = 2
EXIT_CRASH = 3


@dataclass
class Where:
    """A place in the user's code: what a finding points at."""

    file: str | None = None
    line: int | None = None
    function: str | None = None
    module: str | None = None
    column: int | None = None  # 1-based, where a linter knows it

    def label(self) -> str:
        place = self.file or self.module or "?"
        if self.line:
            place = f"{place}:{self.line}"
        return f"{place} in {self.function}" if self.function else place


@dataclass
class Finding:
    code: str
    severity: Severity
    title: str
    detail: str = ""
    where: Where | None = None
    evidence: dict[str, Any] = field(default_factory=dict)
    fix: str = ""
    refs: list[str] = field(default_factory=list)


@dataclass
class Check:
    """One question a probe answered, as one line of the verdict."""

    name: str
    status: CheckStatus
    summary: str
    codes: list[str] = field(default_factory=list)


@dataclass
class Bar:
    label: str
    value: float
    note: str = ""  # what the bar is, in a word ("dense", "fused"): drawn as its colour, said in its text


def site_key(file: str | None, line: int | None, module: str | None) -> str:
    """The key that ties a finding to the table row of the same call site (HTML links them)."""
    return f"{file or ''}:{line or ''}:{module or ''}"


@dataclass
class Comparison:
    """Numbers a reader compares side by side, such as dense versus fused peak memory."""

    title: str
    unit: str
    bars: list[Bar] = field(default_factory=list)


@dataclass
class Table:
    """Rows a reader scans, such as a trace's call sites, already worded: every renderer draws any
    table the same way and knows nothing of the probe that made it."""

    title: str
    columns: list[str]
    rows: list[list[str]] = field(default_factory=list)
    wide_columns: list[str] = field(default_factory=list)  # left to the report files: a terminal is narrow
    row_sites: list[str] = field(default_factory=list)  # per row, its call site's `site_key`, where it has one


@dataclass
class Line:
    label: str
    points: list[list[float]] = field(default_factory=list)  # [x, y] pairs, x ascending


@dataclass
class Mark:
    """A moment on a plot's x axis worth pointing at: the step a dense kernel or an OOM happened."""

    x: float
    label: str


@dataclass
class Plot:
    """Values over time (per step, per rank), drawn as lines with the marked moments."""

    title: str
    unit: str  # of y: "bytes", "seconds", or a word
    x_label: str
    lines: list[Line] = field(default_factory=list)
    marks: list[Mark] = field(default_factory=list)


@dataclass
class ProbeResult:
    """One section of a report. `status` is settled by `settle` when the report is finished: only
    "error" (the probe crashed or was cut short) and "skipped" (it did not apply) are set by hand.
    `subject` says in one line what the section examined (a shape, a device), for the report's header."""

    probe: str
    status: ProbeStatus = "pass"
    duration_s: float = 0.0
    findings: list[Finding] = field(default_factory=list)
    measurements: dict[str, Any] = field(default_factory=dict)
    checks: list[Check] = field(default_factory=list)
    comparisons: list[Comparison] = field(default_factory=list)
    tables: list[Table] = field(default_factory=list)
    subject: str = ""
    plots: list[Plot] = field(default_factory=list)

    def settle(self) -> None:
        """The one pass/fail rule: a section fails when any finding is an error or any check failed.
        A crashed or skipped section stays so: it cannot vouch for anything, nor fail for anything."""
        if self.status in ("error", "skipped"):
            return
        failed = any(f.severity == "error" for f in self.findings) or any(c.status == "fail" for c in self.checks)
        self.status = "fail" if failed else "pass"


@dataclass
class Report:
    command: str
    argv: list[str]
    started: str
    duration_s: float = 0.0
    verdict: Verdict = "pass"
    environment: dict[str, Any] = field(default_factory=dict)
    results: list[ProbeResult] = field(default_factory=list)
    schema: str = SCHEMA
    # What the probes saw, by probe name: written beside the report as observations.json (never
    # into report.json), so a report can be judged again, and a GPU run's judging tested on a CPU.
    observations: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
    # Other files the report folder holds beside the formats, by name (run's trace.json): written
    # with the report, never into report.json.
    files: dict[str, str] = field(default_factory=dict, repr=False, compare=False)

    def findings(self) -> list[Finding]:
        return [f for r in self.results for f in r.findings]

    def exit_code(self) -> int:
        """Crashes outrank findings: a report whose probe died cannot vouch for anything."""
        if self.verdict == "error":
            return EXIT_CRASH
        return EXIT_FINDINGS if self.verdict == "fail" else EXIT_OK

    def settle_verdict(self) -> None:
        """The report's verdict and so its exit code: each section settled by the one rule, then the
        worst of them (a crash outranks a failure)."""
        for result in self.results:
            result.settle()
        crashed = any(r.status == "error" for r in self.results) or any(
            f.code == "probe-crashed" for f in self.findings()
        )
        self.verdict = "error" if crashed else "fail" if any(r.status == "fail" for r in self.results) else "pass"

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("observations")
        data.pop("files")
        for result in data["results"]:  # a column is written only where known (lint): reports written
            for found in result["findings"]:  # before it had one read back as they were
                if found["where"] is not None and found["where"]["column"] is None:
                    del found["where"]["column"]
        # the findings grouped by cause, root cause first (causes.py): what a reader or a CI step
        # takes first; `results` keeps every finding whole
        return {"schema": data.pop("schema"), **data, "causes": [cause.to_dict() for cause in causes(self)]}

    def observations_json(self) -> str:
        """observations.json: the raw observations each probe reported, by probe name."""
        document = {"schema": OBSERVATIONS_SCHEMA, "command": self.command, "probes": self.observations}
        return json.dumps(document, indent=1, default=str)

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, default=str)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Report:
        if data.get("schema") != SCHEMA:
            raise ValueError(f"not a {SCHEMA} document (schema={data.get('schema')!r})")
        results = [probe_result_from_dict(r) for r in data.get("results", [])]
        fields = {k: v for k, v in data.items() if k not in ("results", "schema", "observations", "causes", "files")}
        return cls(**fields, results=results)

    @classmethod
    def from_json(cls, text: str) -> Report:
        return cls.from_dict(json.loads(text))


def finding_from_dict(data: dict[str, Any]) -> Finding:
    where = data.get("where")
    return Finding(**{**data, "where": Where(**where) if where else None})


def _line_from_dict(data: dict[str, Any]) -> Line:
    """A line's points as [x, y] numbers: a damaged document fails here, where it is read (a
    ValueError or TypeError the loader turns into bad input), not later in a renderer."""
    points = []
    for point in data.get("points", []):
        x, y = point
        points.append([float(x), float(y)])
    return Line(**{**data, "points": points})


def probe_result_from_dict(data: dict[str, Any]) -> ProbeResult:
    return ProbeResult(
        **{
            **data,
            "findings": [finding_from_dict(f) for f in data.get("findings", [])],
            "checks": [Check(**c) for c in data.get("checks", [])],
            "comparisons": [
                Comparison(**{**c, "bars": [Bar(**b) for b in c.get("bars", [])]}) for c in data.get("comparisons", [])
            ],
            "tables": [Table(**t) for t in data.get("tables", [])],
            "plots": [
                Plot(
                    **{
                        **p,
                        "lines": [_line_from_dict(line) for line in p.get("lines", [])],
                        "marks": [Mark(**{**m, "x": float(m["x"])}) for m in p.get("marks", [])],
                    }
                )
                for p in data.get("plots", [])
            ],
        }
    )
