"""The held-out check: trace-attention on the cases kept aside before the cause model was designed
(tests/realworld/held_out/truth.json, each with its source and a truth taken with the case's own
probe, tests/realworld/held_out/_truth_probe.py, never with dflashdoctor).

    python3 benchmarks/held_out.py [--json FILE]

Verdict, dense sites and the user's line are scored here; the truth states the cause and the fix in
words, so the table prints the tool's cause kind, summary and fix beside them for a reader to judge
(benchmarks/README.md keeps that judgement).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TRUTH = ROOT / "tests" / "realworld" / "held_out" / "truth.json"


def _trace(script: str, args: list[str]) -> tuple[int, dict[str, Any] | None]:
    with tempfile.TemporaryDirectory() as folder:
        command = [sys.executable, "-m", "dflashdoctor", "trace-attention", "--script", str(ROOT / script)]
        command += ["--report-dir", folder, "--", *args]
        done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=1200)
        try:
            return done.returncode, json.loads((Path(folder) / "report.json").read_text())
        except (OSError, ValueError):
            return done.returncode, None


def _told(report: dict[str, Any]) -> list[dict[str, Any]]:
    codes = ("dense-forward", "dense-backward", "target-raised")
    return [f for r in report["results"] for f in r["findings"] if f["code"] in codes]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, help="write each case's answer as JSON here")
    options = parser.parse_args(argv)
    rows = []
    for truth in json.loads(TRUTH.read_text(encoding="utf-8")):
        code, report = _trace(truth["script"], truth["args"])
        row: dict[str, Any] = {"case": " ".join([Path(truth["script"]).name, *truth["args"]]), "exit": code}
        if report is None:
            rows.append(row | {"verdict": False, "sites": False, "line": False})
            print(f"{row['case']}: no report (exit {code})", flush=True)
            continue
        flex = [r for r in report["results"][0]["measurements"]["call_sites"] if r["impl"] == "flex_attention"]
        dense = {r["module"] or r["function"] for r in flex if r["dense_forward"] or r["dense_backward"]}
        told = _told(report)
        place = f"{truth['change_file']}:{truth['change_line']}" if truth.get("change_line") else None
        also = [f"{truth['change_file']}:{line}" for line in truth.get("also_change_lines") or []]
        named = {f"{(f.get('where') or {}).get('file')}:{(f.get('where') or {}).get('line')}" for f in told}
        details = " ".join(f.get("detail") or "" for f in told)
        row |= {
            "verdict": code == (1 if truth["verdict"] == "dense" else 0),
            "sites": dense == set(truth["dense_sites"]),
            "line": place is None or any(n.endswith(p) or p in details for n in named for p in [place, *also] if p),
            "cause_kinds": sorted({r.get("cause_kind") for r in flex if r.get("cause_kind")}),
            "summary": next((r.get("cause") for r in flex if r.get("cause")), None)
            or next((f["title"] for f in told), None),
            "fix": next((f.get("fix") for f in told), None),
            "truth_cause": truth["cause"],
            "truth_fix": truth["fix"],
        }
        rows.append(row)
        marks = " ".join(f"{d}={'right' if row[d] else 'WRONG'}" for d in ("verdict", "sites", "line"))
        print(f"{row['case']}: {marks} kinds={row['cause_kinds']}", flush=True)
    for dimension in ("verdict", "sites", "line"):
        print(f"- {dimension}: {sum(bool(r.get(dimension)) for r in rows)}/{len(rows)} right")
    if options.json:
        options.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
