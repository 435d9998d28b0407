"""Files a user or another process placed where dflashdoctor reads them: `merge` of parts whose
node.json, observations.json or event logs are links to /dev/zero, FIFOs or hundreds of megabytes,
and a gate `--config` that is /dev/zero or a FIFO. Each ends at once with what was found named
(a part that cannot be read, or one line and exit 2), never a hang or a read to the OOM killer."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.paths import ROOT

PARTS = ROOT / "tests" / "assets" / "observations" / "cpu" / "run-two-nodes"
_MEASURED = (
    "import resource, subprocess, sys\n"
    "done = subprocess.run(sys.argv[1:], capture_output=True, text=True, timeout=120)\n"
    "print(done.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, flush=True)\n"
    "sys.stderr.write(done.stderr)\n"
)


def _shared(tmp_path: Path) -> Path:
    shared = tmp_path / "shared"
    shutil.copytree(PARTS, shared)
    return shared


def _doctor(*args: str) -> tuple[int, int, str]:
    """Exit code, peak RSS (KiB) and stderr of the CLI, run under a process that measures it."""
    done = subprocess.run(
        [sys.executable, "-c", _MEASURED, sys.executable, "-m", "dflashdoctor", *args],
        capture_output=True,
        text=True,
        timeout=180,
    )
    code, peak = done.stdout.split()
    return int(code), int(peak), done.stderr


def _merge(shared: Path, tmp_path: Path) -> tuple[int, int, str, dict]:
    import json

    code, peak, stderr = _doctor("merge", str(shared))  # the merged report goes beside the parts
    report = json.loads((shared / "report.json").read_text()) if code in (0, 1) else {}
    return code, peak, stderr, report


@pytest.mark.parametrize("name", ["node.json", "observations.json"])
@pytest.mark.parametrize("planted", ["dev-zero", "fifo"])
def test_a_part_file_that_is_dev_zero_or_a_fifo_is_not_read(tmp_path, name, planted):
    shared = _shared(tmp_path)
    target = shared / "node1-vm" / name
    target.unlink()
    if planted == "fifo":
        os.mkfifo(target)
    else:
        target.symlink_to("/dev/zero")
    code, peak, stderr, report = _merge(shared, tmp_path)
    assert code == 1 and "Traceback" not in stderr, stderr
    said = " ".join(c["summary"] for r in report["results"] for c in r["checks"])
    codes = {f["code"] for r in report["results"] for f in r["findings"]}
    if name == "observations.json":  # the part is there, and said to be unreadable
        assert "observations.json cannot be read" in said, said
    else:  # a part with no node.json to read is a node missing from the run
        assert "node-missing" in codes, codes
    assert peak < 400 * 1024  # KiB: the doctor's own size, not /dev/zero's


def test_events_placed_as_a_link_to_dev_zero_a_fifo_or_a_huge_line_cost_a_chunk(tmp_path):
    shared = _shared(tmp_path)
    events = shared / "node1-vm" / "events"
    (events / "vm-1.jsonl").symlink_to("/dev/zero")
    os.mkfifo(events / "vm-2.jsonl")
    with open(events / "vm-3.jsonl", "wb") as handle:  # 300 MB with no line end
        handle.write(b"x" * (300 << 20))
    code, peak, stderr, report = _merge(shared, tmp_path)
    assert code in (0, 1) and "Traceback" not in stderr, stderr
    assert peak < 400 * 1024, peak  # KiB: before, the whole 300 MB file was read, then decoded
    damaged = [
        p["measurements"].get("damaged_event_lines") for r in [report] for p in r["results"] if "measurements" in p
    ]
    assert damaged


@pytest.mark.parametrize("planted", ["/dev/zero", "fifo"])
def test_a_gate_config_that_is_dev_zero_or_a_fifo_is_one_line_and_exit_2(tmp_path, planted):
    config = Path(planted)
    if planted == "fifo":
        config = tmp_path / "gate.toml"
        os.mkfifo(config)
    code, _, stderr = _doctor("gate", "--config", str(config), "--report-dir", str(tmp_path / "r"))
    assert code == 2 and "Traceback" not in stderr, stderr
    assert ("a FIFO" if planted == "fifo" else "a character device") in stderr
