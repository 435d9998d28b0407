"""SARIF 2.1.0: code scanning UIs (GitHub, GitLab, Azure DevOps) show findings on the lines they name.

One run, the tool's rules are the finding codes that occur (id, description, default level), one
result per finding with its file and line where known. Paths under the current directory are written
relative to it (how code scanning matches them to the repository), others as file URIs.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from dflashdoctor import __version__
from dflashdoctor.codes import CODES
from dflashdoctor.render.common import repo_path
from dflashdoctor.report import Finding, Report

SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
_LEVEL = {"error": "error", "warning": "warning", "info": "note"}


def _location(finding: Finding) -> list[dict[str, Any]]:
    where = finding.where
    if where is None or not where.file or where.file.startswith("<"):
        return []
    uri = repo_path(where.file)
    if uri.startswith("/"):  # outside the repository: an absolute file URI
        uri = Path(uri).as_uri()
    physical: dict[str, Any] = {"artifactLocation": {"uri": uri}}
    if where.line:
        physical["region"] = {"startLine": int(where.line)}
        if where.column:
            physical["region"]["startColumn"] = int(where.column)
    return [{"physicalLocation": physical}]


def render_sarif(report: Report) -> str:
    findings = [(result.probe, f) for result in report.results for f in result.findings]
    codes = sorted({f.code for _, f in findings})
    rules = [
        {
            "id": code,
            "shortDescription": {"text": CODES[code][1]},
            "defaultConfiguration": {"level": _LEVEL[CODES[code][0]]},
            "helpUri": "https://github.com/dflashdoctor/dflashdoctor#finding-codes",
        }
        for code in codes
    ]
    results = []
    for probe, f in findings:
        text = f"{f.title}. {f.detail}".strip() + (f" Fix: {f.fix}" if f.fix else "")
        result: dict[str, Any] = {
            "ruleId": f.code,
            "ruleIndex": codes.index(f.code),
            "level": _LEVEL[f.severity],
            "message": {"text": text},
            "properties": {"probe": probe},
        }
        locations = _location(f)
        if locations:
            result["locations"] = locations
        results.append(result)
    document = {
        "$schema": SCHEMA,
        "version": "2.1.0",
        "runs": [
            {
                "tool": {"driver": {"name": "dflashdoctor", "version": __version__, "rules": rules}},
                "invocations": [
                    {
                        "executionSuccessful": report.verdict != "error",
                        "commandLine": " ".join(report.argv),
                        "workingDirectory": {"uri": Path(os.getcwd()).resolve().as_uri()},
                    }
                ],
                "results": results,
            }
        ],
    }
    return json.dumps(document, indent=2) + "\n"
