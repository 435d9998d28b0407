"""JUnit XML: what CI systems read. One testsuite per probe, one testcase per check."""

from __future__ import annotations

from xml.etree import ElementTree as ET

from dflashdoctor.report import Report


def render_junit(report: Report) -> str:
    suites = ET.Element("testsuites", name=f"dflashdoctor {report.command}", time=f"{report.duration_s:.3f}")
    for result in report.results:
        checks = result.checks or []
        failures = [c for c in checks if c.status == "fail"]
        suite = ET.SubElement(
            suites,
            "testsuite",
            name=result.probe,
            tests=str(max(len(checks), 1)),
            failures=str(len(failures)),
            errors="1" if result.status == "error" else "0",
            skipped=str(sum(c.status == "skip" for c in checks)),
            time=f"{result.duration_s:.3f}",
        )
        for check in checks:
            case = ET.SubElement(suite, "testcase", classname=f"dflashdoctor.{result.probe}", name=check.name)
            related = [f for f in result.findings if f.code in check.codes]
            if check.status == "fail":
                body = "\n\n".join(f"{f.code}: {f.title}\n{f.detail}\nfix: {f.fix}" for f in related)
                ET.SubElement(case, "failure", message=check.summary, type="dflashdoctor").text = body
            elif check.status == "skip":
                ET.SubElement(case, "skipped", message=check.summary)
            else:
                ET.SubElement(case, "system-out").text = check.summary
        if result.status == "error":
            case = ET.SubElement(suite, "testcase", classname=f"dflashdoctor.{result.probe}", name="probe")
            for f in result.findings:
                ET.SubElement(case, "error", message=f.title, type=f.code).text = str(
                    f.evidence.get("stderr_tail", f.detail)
                )
    ET.indent(suites)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(suites, encoding="unicode") + "\n"
