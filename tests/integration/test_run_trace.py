"""`run` writes trace.json, the Chrome trace event format Perfetto and chrome://tracing open: a real
torchrun of two gloo ranks where rank 1 calls flex_attention eagerly each step. Checked against the
format's documented fields: a named track per process, steps as complete events ("X") with a
duration, the dense calls as instants on rank 1's track only, times in microseconds from zero."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from tests.paths import ROOT

FAULT = ROOT / "tests" / "targets" / "run" / "ddp_fault_on_one_rank.py"


@pytest.mark.skipif(shutil.which("torchrun") is None, reason="needs torchrun")
def test_a_two_rank_run_is_a_timeline_with_a_track_per_rank(tmp_path):
    report_dir = tmp_path / "run"
    command = [shutil.which("torchrun"), "--nproc-per-node", "2", str(FAULT)]
    done = subprocess.run(
        [sys.executable, "-m", "dflashdoctor", "run", "--report-dir", str(report_dir), "--", *command],
        capture_output=True, text=True, cwd=tmp_path, timeout=600,
    )  # fmt: skip
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]  # rank 1's dense calls fail it
    assert "trace.json in the report folder" in done.stdout and "tlparse" in done.stdout
    trace = json.loads((report_dir / "trace.json").read_text(), parse_constant=_no_constant)
    events = trace["traceEvents"]
    assert all({"ph", "name", "pid"} <= set(event) for event in events)
    tracks = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    ranks = {name.split(" (")[0]: pid for pid, name in tracks.items() if name.startswith("rank ")}
    assert set(ranks) == {"rank 0", "rank 1"}
    timed = [e for e in events if e["ph"] in ("X", "i", "C")]
    assert timed and all(e["ts"] >= 0 for e in timed) and min(e["ts"] for e in timed) == 0
    steps = [e for e in events if e["ph"] == "X" and e["cat"] == "step"]
    assert {e["pid"] for e in steps} == set(ranks.values()) and all(e["dur"] > 0 for e in steps)
    dense = [e for e in events if e.get("cat") == "dense"]
    assert dense and {e["pid"] for e in dense} == {ranks["rank 1"]}
    assert all(e["args"]["site"].endswith(f"{FAULT.name}:{_line('FLEX_LINE')}") for e in dense)


def _line(marker: str) -> int:
    return next(i for i, text in enumerate(FAULT.read_text().splitlines(), 1) if marker in text)


def _no_constant(name: str) -> None:
    raise AssertionError(f"{name} in trace.json: not JSON a trace viewer reads")
