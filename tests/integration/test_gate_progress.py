"""The gate as a person watches it: a line per finished probe in a CI log, a live list on a terminal
(a real pseudo-terminal), what was cut short on Ctrl-C or SIGTERM, and a passing gate that reads in
about fifteen lines. Real gate runs in child processes (env, check-compile on the reference wrapper,
cache)."""

from __future__ import annotations

import json
import os
import pty
import select
import signal
import subprocess
import sys
import time

import pytest

GATE = [sys.executable, "-m", "dflashdoctor", "gate"]


@pytest.fixture
def gate_folder(tmp_path):
    (tmp_path / "dflashdoctor.toml").write_text('probes = ["env", "check-compile", "cache"]\n')
    return tmp_path


def test_a_ci_log_gets_a_line_per_probe_and_a_passing_gate_reads_in_fifteen_lines(gate_folder):
    log = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}  # a CI job's environment
    done = subprocess.run(GATE, capture_output=True, text=True, cwd=gate_folder, timeout=600, env=log)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    told = sorted(line.split()[2] for line in done.stderr.splitlines() if line.startswith("dflashdoctor gate: "))
    assert told == ["cache", "check-compile", "env"]
    assert all(" pass in " in line for line in done.stderr.splitlines() if line.startswith("dflashdoctor gate: "))
    lines = done.stdout.splitlines()
    assert len(lines) <= 15, done.stdout
    assert "  ✔ check-compile  pass · " in done.stdout
    assert all(line == line.rstrip() for line in lines)
    # the report's timeline: each probe from when it started, side by side, within the gate's time
    (folder,) = (gate_folder / "reports").iterdir()
    report = json.loads((folder / "report.json").read_text())
    ends = [r["measurements"]["started_after_s"] + r["duration_s"] for r in report["results"]]
    assert max(ends) <= report["duration_s"] + 0.5 < sum(r["duration_s"] for r in report["results"]) + 0.5
    assert "what ran when" in (folder / "report.html").read_text()


@pytest.mark.parametrize(("stop", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_stopped_mid_way_it_says_which_probes_were_cut_short(gate_folder, stop, code):
    child = subprocess.Popen(GATE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=gate_folder)
    time.sleep(2.5)  # the cache probe is done by now; env and check-compile are importing torch
    child.send_signal(stop)
    out, err = child.communicate(timeout=120)
    assert child.returncode == code, err
    (said,) = [line for line in err.splitlines() if "stopped while running" in line]
    assert "check-compile (" in said and said.endswith("; no report")
    assert "check-compile error" not in err  # how a stopped probe ends is the stop's doing: not told
    assert out == "" and not (gate_folder / "reports").exists()


def test_a_terminal_sees_the_probes_run_then_the_report(gate_folder):
    primary, secondary = pty.openpty()
    env = {**os.environ, "COLUMNS": "100", "TERM": "xterm"}
    child = subprocess.Popen(GATE, stdin=secondary, stdout=secondary, stderr=secondary, cwd=gate_folder, env=env)
    os.close(secondary)
    seen = b""
    while True:
        ready, _, _ = select.select([primary], [], [], 600)
        if not ready:
            break
        try:
            chunk = os.read(primary, 65536)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        seen += chunk
    assert child.wait(timeout=60) == 0
    os.close(primary)
    text = seen.decode("utf-8", "replace")
    assert "dflashdoctor gate: " in text and " running, " in text  # the live list's head, redrawn
    assert text.index(" running, ") < text.index("PASS: ")  # it ran before the report printed
    assert "dflashdoctor gate: env pass in" not in text  # on a terminal the live list says it, not lines
