"""SARIF as GitHub code scanning takes it, checked on real reports: the H200 trace of the drafter
(findings in the checkout's files), the same report read from a folder it is not in (every file
outside: library related locations, the result on the user's own file), and a gate's findings that
have no line at all. GitHub's documented rules: a location on every result, relative URIs on a
`%SRCROOT%` base given once, `partialFingerprints`, rules with help, one `automationDetails.id` per
command; and the 2.1.0 schema."""

from __future__ import annotations

import json
import shutil

from dflashdoctor.commands.show import load_report
from dflashdoctor.render.sarif import SRCROOT, render_sarif
from dflashdoctor.report import Finding, ProbeResult, Report
from tests import schemas
from tests.paths import ROOT

EAGER_WRAPPER = ROOT / "reports" / "examples" / "h200-trace-drafter-eager-wrapper" / "report.json"


def _github_rules(document: dict) -> list[dict]:
    (run,) = document["runs"]
    assert run["automationDetails"]["id"].startswith("dflashdoctor/")
    assert run["originalUriBaseIds"][SRCROOT]["uri"].endswith("/")
    for rule in run["tool"]["driver"]["rules"]:
        assert rule["help"]["text"] and rule["fullDescription"]["text"] and "placeholder" not in json.dumps(rule)
    for result in run["results"]:
        assert result["partialFingerprints"]
        (location,) = result["locations"]
        artifact = location["physicalLocation"]["artifactLocation"]
        assert artifact["uriBaseId"] == SRCROOT and not artifact["uri"].startswith(("/", "file:"))
    return run["results"]


def test_findings_in_the_checkout_point_at_their_lines(tmp_path, monkeypatch, sarif_schema):
    """The drafter's files copied into a checkout where the report says they were."""
    report = load_report(EAGER_WRAPPER)
    checkout = tmp_path / "checkout"
    (checkout / "dflashdoctor" / "reference").mkdir(parents=True)
    shutil.copy(ROOT / "dflashdoctor" / "reference" / "drafter.py", checkout / "dflashdoctor" / "reference")
    for found in report.findings():
        found.where.file = str(checkout / "dflashdoctor" / "reference" / "drafter.py")
    monkeypatch.chdir(checkout)
    document = json.loads(render_sarif(report))
    assert schemas.sarif_errors(document, sarif_schema) == []
    results = _github_rules(document)
    assert len(results) == 10 and len({r["partialFingerprints"]["dflashdoctorFinding/v1"] for r in results}) == 10
    region = results[0]["locations"][0]["physicalLocation"]
    assert (
        region["artifactLocation"]["uri"] == "dflashdoctor/reference/drafter.py" and region["region"]["startLine"] == 49
    )


def test_a_library_file_is_a_related_location_and_the_result_sits_on_the_users_file(tmp_path, monkeypatch):
    report = load_report(EAGER_WRAPPER)
    for found in report.findings():
        found.where.file = "/usr/lib/python3.12/site-packages/transformers/integrations/flex_attention.py"
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    monkeypatch.chdir(tmp_path)
    for result in _github_rules(json.loads(render_sarif(report))):
        assert result["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] == "pyproject.toml"
        (library,) = result["relatedLocations"]
        assert library["properties"]["library"] is True and "site-packages/transformers" in library["message"]["text"]


def test_a_gate_finding_without_a_line_sits_on_the_gates_configuration(tmp_path, monkeypatch):
    (tmp_path / "dflashdoctor.toml").write_text('probes = ["env"]\n')
    monkeypatch.chdir(tmp_path)
    report = Report(command="gate", argv=["dflashdoctor", "gate"], started="now")
    report.environment["gate_config_path"] = str(tmp_path / "dflashdoctor.toml")
    report.results.append(
        ProbeResult("env", findings=[Finding("env-hazard", "warning", "TORCHDYNAMO_DISABLE=1 is set")])
    )
    (result,) = _github_rules(json.loads(render_sarif(report)))
    assert result["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] == "dflashdoctor.toml"
    moved = json.loads(render_sarif(report))["runs"][0]["results"][0]["partialFingerprints"]
    assert moved == result["partialFingerprints"]  # the same finding, the same alert
