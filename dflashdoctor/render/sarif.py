"""SARIF 2.1.0 as GitHub code scanning takes it (also GitLab, Azure DevOps): the findings on the lines
they name, in the checkout.

- The tool's rules are the codes that occur: id, short and full description, default level, `help`
  (what the code means and the fix, as text and Markdown), and `helpUri` only where the installed
  package declares its documentation (a URL of its metadata; no placeholder).
- Every result has a location, because code scanning shows none without one: its file where it has
  one in the checkout, relative to `%SRCROOT%` (the folder the command ran in, given once in
  `originalUriBaseIds`); a file outside it (site-packages, torch) is a related location marked
  `library`, and the result is placed on what the user controls instead: the command's own file
  (the configuration the gate read, the script `run` ran), else pyproject.toml, else
  dflashdoctor.toml.
- `partialFingerprints` from the code, the file, the function, the module (a layer) and the title
  without its numbers, so a finding keeps its alert across runs and line moves;
  `automationDetails.id` per command, so a gate's and a lint's uploads of one commit are two
  categories, not one overwriting the other.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from importlib import metadata
from pathlib import Path
from typing import Any
from urllib.parse import quote

from dflashdoctor import __version__
from dflashdoctor.codes import CODES
from dflashdoctor.report import Finding, Report

SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
SRCROOT = "%SRCROOT%"
_LEVEL = {"error": "error", "warning": "warning", "info": "note"}
_NUMBERS = re.compile(r"\d+(\.\d+)?")


def _checkout() -> Path:
    return Path(os.getcwd()).resolve()


def _in_checkout(file: str) -> str | None:
    """`file` relative to the checkout, posix, where it is inside it; None outside (or not a file)."""
    if not file or file.startswith("<"):
        return None
    try:
        relative = Path(file).resolve().relative_to(_checkout())
    except (ValueError, OSError):
        return None
    return relative.as_posix() if "site-packages" not in relative.parts else None


def _physical(uri: str, line: int | None = None, column: int | None = None, *, base: bool = True) -> dict[str, Any]:
    """A physical location; a path relative to the checkout is percent-encoded (a URI has no spaces)."""
    artifact: dict[str, Any] = {"uri": quote(uri, safe="/") if base else uri}
    if base:
        artifact["uriBaseId"] = SRCROOT
    physical: dict[str, Any] = {"artifactLocation": artifact}
    if line:
        physical["region"] = {"startLine": int(line)} | ({"startColumn": int(column)} if column else {})
    return {"physicalLocation": physical}


def _own_file(report: Report) -> str:
    """What the user controls that the whole command stands on: the configuration the gate read,
    the script a `run`/`trace-attention` ran, pyproject.toml where it is; else dflashdoctor.toml,
    the file the tool's settings would go in (code scanning lists a result on a missing file)."""
    candidates = [str(report.environment.get("gate_config_path") or "")]
    candidates += [arg for arg in report.argv if arg.endswith((".py", ".toml"))]
    candidates += ["dflashdoctor.toml", "pyproject.toml"]
    for candidate in candidates:
        relative = _in_checkout(candidate) if candidate else None
        if relative is not None and Path(candidate).is_file():
            return relative
    return "dflashdoctor.toml"


def _locations(finding: Finding, fallback: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The result's locations and related locations (a library file, which code scanning cannot show)."""
    where = finding.where
    if where is not None and where.file:
        inside = _in_checkout(where.file)
        if inside is not None:
            return [_physical(inside, where.line, where.column)], []
        if not where.file.startswith("<"):
            uri = Path(where.file).as_uri() if Path(where.file).is_absolute() else where.file
            outside = _physical(uri, where.line, base=False)
            outside |= {"id": 0, "message": {"text": f"in library code: {where.label()}"}}
            outside["properties"] = {"library": True}
            return [_physical(fallback)], [outside]
    return [_physical(fallback)], []


def _fingerprint(finding: Finding) -> str:
    where = finding.where
    place = (
        (_in_checkout(where.file or "") or where.file or "", where.function or "", where.module or "")
        if where
        else ("", "", "")
    )
    stable = "\0".join((finding.code, *place, _NUMBERS.sub("#", finding.title)))
    return hashlib.sha256(stable.encode()).hexdigest()[:32]


def _docs_url() -> str | None:
    """The documentation URL the installed package declares, if any."""
    try:
        urls = metadata.metadata("dflashdoctor").get_all("Project-URL") or []
    except metadata.PackageNotFoundError:
        return None
    for entry in urls:
        label, _, url = entry.partition(",")
        if label.strip().lower() in ("documentation", "docs") and url.strip().startswith("https://"):
            return url.strip()
    return None


def _rule(code: str, docs: str | None) -> dict[str, Any]:
    severity, meaning = CODES[code]
    rule: dict[str, Any] = {
        "id": code,
        "name": "".join(word.capitalize() for word in code.split("-")),
        "shortDescription": {"text": meaning},
        "fullDescription": {"text": f"{code}: {meaning}."},
        "defaultConfiguration": {"level": _LEVEL[severity]},
        "help": {
            "text": f"{meaning}. Each result says where, why and the fix; `dflashdoctor show report.json` "
            "renders the whole report.",
            "markdown": f"**`{code}`** ({severity}): {meaning}.\n\nEach result says where, why and the fix; "
            "`dflashdoctor show report.json` renders the whole report.",
        },
    }
    if docs:
        rule["helpUri"] = f"{docs.rstrip('/')}/codes.md#{code}"
    return rule


def render_sarif(report: Report) -> str:
    findings = [(result.probe, f) for result in report.results for f in result.findings]
    codes = sorted({f.code for _, f in findings})
    docs = _docs_url()
    fallback = _own_file(report)
    results = []
    for probe, f in findings:
        text = f"{f.title}. {f.detail}".strip() + (f" Fix: {f.fix}" if f.fix else "")
        result: dict[str, Any] = {
            "ruleId": f.code,
            "ruleIndex": codes.index(f.code),
            "level": _LEVEL[f.severity],
            "message": {"text": text},
            "partialFingerprints": {"dflashdoctorFinding/v1": _fingerprint(f)},
            "properties": {"probe": probe},
        }
        result["locations"], related = _locations(f, fallback)
        if related:
            result["relatedLocations"] = related
        results.append(result)
    document = {
        "$schema": SCHEMA,
        "version": "2.1.0",
        "runs": [
            {
                "tool": {
                    "driver": {
                        "name": "dflashdoctor",
                        "version": __version__,
                        "rules": [_rule(code, docs) for code in codes],
                    }
                    | ({"informationUri": docs} if docs else {})
                },
                "automationDetails": {"id": f"dflashdoctor/{report.command}/"},
                "originalUriBaseIds": {SRCROOT: {"uri": _checkout().as_uri() + "/"}},
                "invocations": [
                    {
                        "executionSuccessful": report.verdict != "error",
                        "commandLine": " ".join(report.argv),
                        "workingDirectory": {"uri": _checkout().as_uri()},
                    }
                ],
                "results": results,
            }
        ],
    }
    return json.dumps(document, indent=2) + "\n"
