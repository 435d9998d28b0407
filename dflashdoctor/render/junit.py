"""JUnit XML: what CI systems read. One testsuite per probe, one testcase per check, and a `probe`
testcase carrying the errors of a probe that crashed. The counts are taken from the cases written,
so Jenkins, GitLab and GitHub's reporters show the same numbers as the report."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from xml.etree import ElementTree as ET

from dflashdoctor.report import Check, Finding, ProbeResult, Report
from dflashdoctor.safe_text import with_strings, xml_legal


def _related(result: ProbeResult) -> Callable[[Check], list[Finding]]:
    """The findings each check stands for, in the section's order: those of its codes, and of a
    finding about one node (its evidence names a node the section has a check of) only that node's
    check. Indexed once, so that a gate of N nodes writes each node's finding once, not N times
    (N x N findings of 1,024 unreachable hosts stalled it)."""
    general: dict[str, list[int]] = defaultdict(list)
    per_subject: dict[tuple[str, str], list[int]] = defaultdict(list)
    checks = {check.name for check in result.checks or []}
    for index, found in enumerate(result.findings):
        subject = found.evidence.get("node") if isinstance(found.evidence, dict) else None
        if isinstance(subject, str) and subject in checks:
            per_subject[(found.code, subject)].append(index)
        else:
            general[found.code].append(index)

    def related(check: Check) -> list[Finding]:
        codes = set(check.codes)
        own = sorted(i for code in codes for i in per_subject.get((code, check.name), ()))
        chosen = own or sorted(i for code in codes for i in general.get(code, ()))
        return [result.findings[i] for i in chosen]

    return related


def _cases(result: ProbeResult) -> list[ET.Element]:
    cases = []
    related_to = _related(result)
    for check in result.checks or []:
        case = ET.Element("testcase", classname=f"dflashdoctor.{result.probe}", name=check.name)
        related = related_to(check)
        if check.status == "fail":
            body = "\n\n".join(f"{f.code}: {f.title}\n{f.detail}\nfix: {f.fix}" for f in related)
            ET.SubElement(case, "failure", message=check.summary, type="dflashdoctor").text = body
        elif check.status == "skip":
            ET.SubElement(case, "skipped", message=check.summary)
        else:
            ET.SubElement(case, "system-out").text = check.summary
        cases.append(case)
    if result.status == "error":
        case = ET.Element("testcase", classname=f"dflashdoctor.{result.probe}", name="probe")
        for f in result.findings:
            ET.SubElement(case, "error", message=f.title, type=f.code).text = str(
                f.evidence.get("stderr_tail", f.detail)
            )
        cases.append(case)
    return cases


def render_junit(report: Report) -> str:
    report = with_strings(report, xml_legal)  # ElementTree escapes markup, not characters XML forbids
    suites = ET.Element("testsuites", name=f"dflashdoctor {report.command}", time=f"{report.duration_s:.3f}")
    for result in report.results:
        cases = _cases(result)
        suite = ET.SubElement(
            suites,
            "testsuite",
            name=result.probe,
            tests=str(len(cases)),
            failures=str(sum(case.find("failure") is not None for case in cases)),
            errors=str(sum(case.find("error") is not None for case in cases)),
            skipped=str(sum(case.find("skipped") is not None for case in cases)),
            time=f"{result.duration_s:.3f}",
        )
        suite.extend(cases)
    ET.indent(suites)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(suites, encoding="unicode") + "\n"
