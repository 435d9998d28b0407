"""Findings grouped by cause, on real reports: the H200 trace of the drafter whose wrapper compiles
with backend="eager" (10 findings: forward and backward dense in each of 5 layers, one line, one
fix) reads as two causes with five places each; a run that ran out of memory leads with the OOM,
and "the command exited with 1" comes last. Then the terminal: a CI log is not cut into 80-column
pieces, a terminal's wrapped lines hang at their indent, and no line ends in spaces."""

from __future__ import annotations

import io
import json

from rich.console import Console

from dflashdoctor.causes import causes
from dflashdoctor.commands.show import load_report
from dflashdoctor.render.terminal import render_terminal
from dflashdoctor.report import Finding, ProbeResult, Report, Where
from tests.paths import ROOT

EAGER_WRAPPER = ROOT / "reports" / "examples" / "h200-trace-drafter-eager-wrapper" / "report.json"


def test_one_eager_wrapper_is_two_causes_with_their_five_layers():
    report = load_report(EAGER_WRAPPER)
    assert len(report.findings()) == 10
    forward, backward = causes(report)
    assert (forward.code, backward.code) == ("dense-forward", "dense-backward")
    for cause in (forward, backward):
        assert cause.count == 5 and cause.where.label().endswith("reference/drafter.py:49 in forward")
        assert [cause.place_label(p) for p in cause.places] == [f"layers.{i}.self_attn" for i in range(5)]
    assert forward.title == "flex_attention forward ran the dense kernel (1 of 1 calls)"
    written = json.loads(report.to_json())["causes"]
    assert [(c["code"], c["count"]) for c in written] == [("dense-forward", 5), ("dense-backward", 5)]


def _run_report() -> Report:
    """A `run` of two ranks: both exited 1, rank 1 ran out of memory at the dense call that caused it."""
    where = Where(file="/w/train.py", line=12, function="step")
    ranks = []
    for rank in (0, 1):
        section = ProbeResult(probe=f"rank {rank}")
        if rank == 1:
            section.findings.append(
                Finding("dense-forward", "error", "attn: flex_attention forward ran the dense kernel", where=where)
            )
            section.findings.append(
                Finding("oom", "error", "Out of memory in attn", where=where, evidence={"rank": 1, "pid": 7})
            )
        section.findings.append(
            Finding("child-failed", "error", "The command exited with 1", evidence={"rank": rank, "pid": rank + 6})
        )
        ranks.append(section)
    return Report(command="run", argv=["run"], started="now", results=ranks)


def test_the_root_cause_leads_and_the_exit_code_it_led_to_comes_last():
    report = _run_report()
    report.settle_verdict()
    told = causes(report)
    assert [c.code for c in told] == ["oom", "dense-forward", "child-failed"]
    assert [told[-1].place_label(p) for p in told[-1].places] == ["rank 0 (pid 6)", "rank 1 (pid 7)"]


def _terminal(report: Report, console: Console) -> list[str]:
    render_terminal(report, console)
    return console.file.getvalue().splitlines()


def test_a_ci_log_is_never_hard_wrapped_and_a_terminal_hangs_its_wrapped_lines():
    report = load_report(EAGER_WRAPPER)
    detail = report.findings()[0].detail
    log = _terminal(report, Console(file=io.StringIO(), width=240, soft_wrap=True))
    assert f"    {detail}" in log  # the whole detail on one line, as a log search finds it
    narrow = _terminal(report, Console(file=io.StringIO(), width=80))
    assert all(len(line) <= 80 and line == line.rstrip() for line in narrow)
    at = narrow.index(next(line for line in narrow if line.startswith("[error] dense-backward")))
    following = narrow[at + 1 : narrow.index("", at) if "" in narrow[at:] else len(narrow)]
    assert following and all(line.startswith("    ") for line in following)  # nothing back at column 0
