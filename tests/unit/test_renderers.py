"""Renderers: HTML escapes everything, JUnit parses, JSON round-trips through the model."""

from __future__ import annotations

import json
from pathlib import Path
from xml.etree import ElementTree as ET

from dflashdoctor.codes import finding
from dflashdoctor.render import write_report_dir
from dflashdoctor.render.html import render_html
from dflashdoctor.render.junit import render_junit
from dflashdoctor.render.markdown import render_markdown
from dflashdoctor.render.sarif import render_sarif
from dflashdoctor.report import Bar, Check, Comparison, Finding, ProbeResult, Report, Where
from tests import schemas

HOSTILE = "<script>alert('x')</script>"


def rendered_markdown(text: str) -> str:
    """Markdown as a viewer shows it (CommonMark, raw HTML allowed, as GitHub passes much of it)."""
    from markdown_it import MarkdownIt

    return MarkdownIt("commonmark").render(text)


def hostile_report() -> Report:
    dense = finding(
        "dense-forward",
        f"dense call from {HOSTILE}",
        detail=f"q [1, 8, 256, 64] & {HOSTILE}",
        where=Where(file=f"/tmp/{HOSTILE}.py", line=7, function=HOSTILE, module="m"),
        evidence={"stack": [f"{HOSTILE}:7 in f"]},
        fix="compile it",
    )
    note = finding("backward-not-checked", "Backward not checked on cpu")
    result = ProbeResult(
        probe="check-compile",
        status="fail",
        duration_s=1.5,
        findings=[dense, note],
        measurements={"fwd_peak_bytes": 17_000_000, "vary": [{"kv_len": 1}], "label": HOSTILE},
        checks=[
            Check("forward", "fail", f"dense forward {HOSTILE}", ["dense-forward"]),
            Check("backward", "skip", "not checked on cpu", ["backward-not-checked"]),
            Check("numerics", "pass", "relative error 1e-7"),
        ],
        comparisons=[Comparison("Backward peak memory", "bytes", [Bar("fused", 7.5e7), Bar(HOSTILE, 1.78e10)])],
    )
    report = Report(command="check-compile", argv=["dflashdoctor", HOSTILE], started="2026-11-30T00:00:00+00:00")
    report.results.append(result)
    report.environment["target"] = HOSTILE
    report.settle_verdict()
    return report


def test_html_escapes_every_string_and_draws_charts():
    page = render_html(hostile_report())
    assert "<script" not in page
    assert "&lt;script&gt;" in page
    assert page.count("<svg") == 1
    assert "16.6 GiB" in page  # 1.78e10 bytes, on the chart
    assert "http" not in page.replace('xmlns="http://www.w3.org/2000/svg"', "")  # nothing fetched


def test_junit_parses_with_one_case_per_check():
    root = ET.fromstring(render_junit(hostile_report()))
    (suite,) = root.findall("testsuite")
    cases = suite.findall("testcase")
    assert [c.get("name") for c in cases] == ["forward", "backward", "numerics"]
    assert suite.get("failures") == "1"
    failure = cases[0].find("failure")
    assert failure is not None and "dense-forward" in failure.text
    assert cases[1].find("skipped") is not None


def test_junit_and_sarif_validate_against_the_published_schemas(sarif_schema, junit_schemas):
    """Failures, skips, a crashed probe (JUnit <error>) and hostile strings, all schema-valid."""
    crashed = ProbeResult(probe="race", status="error", findings=[finding("probe-crashed", f"race {HOSTILE}")])
    report = hostile_report()
    report.results.append(crashed)
    report.settle_verdict()
    xml = render_junit(report)
    (_, race_suite) = ET.fromstring(xml).findall("testsuite")
    assert race_suite.get("errors") == "1" and race_suite.find("testcase/error") is not None
    assert schemas.junit_errors(xml, junit_schemas) == []
    assert schemas.sarif_errors(json.loads(render_sarif(report)), sarif_schema) == []


def test_json_round_trips_through_the_model():
    report = hostile_report()
    assert Report.from_json(report.to_json()) == report


def test_markdown_and_report_dir(tmp_path):
    report = hostile_report()
    text = render_markdown(report)
    assert "`dense-forward`" in text and "| forward | FAIL |" in text
    written = write_report_dir(report, tmp_path / "out")
    names = ["junit.xml", "report.html", "report.json", "report.md", "report.sarif"]
    assert sorted(p.name for p in written.iterdir()) == names
    sarif = json.loads((written / "report.sarif").read_text())  # hostile strings stay JSON strings
    codes = {f.code for f in report.findings()}
    assert {r["ruleId"] for r in sarif["runs"][0]["results"]} == codes
    assert Report.from_json((written / "report.json").read_text()) == report


def test_verdicts_and_exit_codes():
    report = hostile_report()
    assert (report.verdict, report.exit_code()) == ("fail", 1)
    report.results[0].findings = [finding("probe-crashed", "probe check_compile timed out")]
    report.settle_verdict()
    assert (report.verdict, report.exit_code()) == ("error", 3)
    report.results[0].findings = []
    report.settle_verdict()
    assert (report.verdict, report.exit_code()) == ("fail", 1)  # a failed check fails its section too
    report.results[0].checks = [c for c in report.results[0].checks if c.status != "fail"]
    report.settle_verdict()
    assert (report.verdict, report.exit_code()) == ("pass", 0)


def test_strings_are_made_safe_for_each_output():
    from dflashdoctor import safe_text as text

    assert text.encodable("lat\udce9n") == "lat\\xe9n"  # a file name's undecodable byte, as ls -b shows it
    assert text.encodable("a\ud800b") == "a\\ud800b"  # a surrogate that is no escaped byte
    assert text.encodable("plain é") == "plain é"
    assert text.without_controls("a\x1b[31mb\x07\x9b\n\t") == "a\\x1b[31mb\\x07\\x9b\n\t"
    assert text.xml_legal("a\x00b\ufffe\n\r\t") == "a\\x00b\\ufffe\n\r\t"
    assert text.markdown_text("<img onerror=x>&") == "&lt;img onerror=x&gt;&amp;"
    assert text.markdown_code("a ``b`` c") == "```a ``b`` c```"
    assert text.markdown_code("`x`") == "`` `x` ``"


def test_every_file_of_a_report_dir_takes_hostile_strings(tmp_path):
    """Surrogates, control characters and markup anywhere in a report: every format is written and
    valid, and the JSON reads back."""
    from dflashdoctor.safe_text import encodable_report

    hostile = "lat\udce9n \ud800 \x1b[2J\x00\x07 <img src=x onerror=alert(1)> ```"
    report = hostile_report()
    report.results[0].findings[0].title += hostile
    report.results[0].checks[0].summary += hostile
    report.environment["target"] = hostile
    report.results[0].findings[0].evidence["path"] = Path(hostile)
    written = write_report_dir(encodable_report(report), tmp_path / "out")
    ET.parse(written / "junit.xml")
    json.loads((written / "report.sarif").read_text(encoding="utf-8"))
    assert (
        Report.from_json((written / "report.json").read_text(encoding="utf-8"))
        .environment["target"]
        .startswith("lat\\xe9n \\ud800")
    )
    html = (written / "report.html").read_text(encoding="utf-8")
    shown = rendered_markdown((written / "report.md").read_text(encoding="utf-8"))
    for page in (html, shown):
        assert "<img" not in page and "\x1b" not in page and "\x00" not in page


def test_charts_take_any_numbers_and_strings():
    """nan, infinities, negatives, zero and huge values, hostile labels, one point or none: a chart
    is drawn or left out, never an exception, and no label reaches the page unescaped."""
    from dflashdoctor.render.svg import bar_chart, human, line_chart
    from dflashdoctor.report import Line, Mark, Plot

    odd = [float("nan"), float("inf"), -5.0, 0.0, 1e300, 3.0]
    bars = Comparison("odd <b>numbers</b>", "bytes", [Bar(HOSTILE, v, note="dense") for v in odd])
    drawn = bar_chart(bars)
    assert "<script>" not in drawn and "&lt;script&gt;" in drawn and "<svg" in drawn
    for points in ([], [[1, 5.0]], [[1, float("nan")], [2, float("inf")], [3, -1.0], [4, 1e300]]):
        plot = Plot(HOSTILE, "seconds", "step", [Line(HOSTILE, points)], [Mark(float("nan"), HOSTILE), Mark(2, "x")])
        svg = line_chart(plot)
        assert "<script>" not in svg
    assert line_chart(Plot("empty", "bytes", "step")) == ""
    assert human(8892582912, "bytes") == "8.28 GiB" and human(0.0123, "seconds") == "12.3 ms"
    assert human(1, "calls") == "1 call" and human(2, "calls") == "2 calls"


def test_a_line_chart_keeps_every_coordinate_finite_and_inside_its_frame():
    """Values near the float limit (whose span overflows), all negative, or all equal: every drawn
    coordinate is a finite number inside the viewBox, and the text table says only what is drawn."""
    import re

    from dflashdoctor.render.svg import line_chart
    from dflashdoctor.report import Line, Plot

    cases = ([[0, 1e308], [1, 1.7e308]], [[0, -1e308], [1, 1.7e308]], [[0, -5.0], [1, -10.0]], [[0, 5.0], [1, 5.0]])
    for points in cases:
        svg = line_chart(Plot("p", "bytes", "step", [Line("a", [*points, [2, float("inf")]])]))
        width, height = map(float, re.search(r'viewBox="0 0 (\S+) (\S+)"', svg).groups())
        drawn = re.search(r'points="([^"]+)"', svg).group(1)
        coords = [float(v) for pair in drawn.split() for v in pair.split(",")]
        ticks = [float(v) for v in re.findall(r'<text x="[^"]+" y="([^"]+)"', svg)]
        assert all(0 <= c <= max(width, height) for c in coords + ticks), (points, coords, ticks)
        assert "inf" not in svg.split("<table")[0] and "nan" not in svg


def test_the_summary_sentence_names_the_first_error_and_where():
    from dflashdoctor.render.common import summary_sentence

    report = hostile_report()
    sentence = summary_sentence(report)
    first = next(f for f in report.findings() if f.severity == "error")
    assert sentence.startswith(first.title.rstrip(".")) and sentence.endswith(".")
    clean = Report(command="gate", argv=[], started="now", results=[ProbeResult(probe="env")])
    assert summary_sentence(clean) == "Nothing here blocks the run: 1 sections pass."


def test_a_finding_links_to_its_call_site_row_and_back():
    from dflashdoctor.report import Table, Where, site_key

    where = Where(file="/x/model.py", line=7, function="forward", module="layers.0.attn")
    finding = Finding("dense-forward", "error", "dense", where=where)
    table = Table(
        "call sites",
        ["module"],
        [["layers.0.attn"], ["layers.1.attn"]],
        row_sites=[site_key("/x/model.py", 7, "layers.0.attn"), site_key("/x/model.py", 7, "layers.1.attn")],
    )
    report = Report(
        command="trace-attention",
        argv=[],
        started="now",
        results=[ProbeResult(probe="trace-attention", findings=[finding], tables=[table])],
    )
    html = render_html(report)
    assert 'id="s0-f0"' in html and 'href="#s0-t0-r0"' in html and 'href="#s0-f0"' in html
    assert 'href="#s0-t0-r1"' not in html  # the other layer has no finding


def test_junit_gives_each_node_its_own_finding_only():
    """A gate of many unreachable hosts: each node's testcase carries that node's finding, not all of
    them (128 hosts wrote 16,384 copies; 1,024 took seconds and hundreds of megabytes)."""
    from dflashdoctor.judges.nodes import NodeOutcome, judge

    outcomes = [NodeOutcome(f"node{i}", error=f"refused at node{i}") for i in range(64)]
    report = Report(command="gate", argv=[], started="now", results=[judge(outcomes)])
    cases = ET.fromstring(render_junit(report)).iter("testcase")
    bodies = {case.get("name"): case.find("failure").text for case in cases if case.get("name").startswith("node")}
    assert len(bodies) == 64
    for name, body in bodies.items():
        assert body.count("node-unreachable") == 1 and f"refused at {name}" in body


def test_a_newline_in_a_file_name_cannot_forge_a_terminal_line():
    import io

    from rich.console import Console

    from dflashdoctor.render.terminal import render_terminal

    name = "/cache/ab/c\nERROR: forged line.py"
    forged = finding(
        "cache-corrupt-entry", f"Broken entry: {name}", detail=f"{name} under root", where=Where(file=name)
    )
    result = ProbeResult(probe="cache", status="fail", findings=[forged], checks=[Check(name, "fail", name, [])])
    buffer = io.StringIO()
    render_terminal(Report(command="cache", argv=[], started="now", results=[result]), Console(file=buffer, width=200))
    lines = buffer.getvalue().splitlines()
    assert not [line for line in lines if line.startswith("ERROR: forged")], lines
    assert any("c\\nERROR: forged line.py" in line for line in lines)
