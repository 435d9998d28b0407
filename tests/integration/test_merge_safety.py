"""`merge` as root over a shared run folder another local user (nobody, through setpriv) can write
into: a part of theirs whose `events` is a link to root's own private run must put none of that run's
text into the merged report, which is 0644 and shared. The parts are the recorded two-node run's."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import as_nobody, run_main_here
from tests.unit.recorded import ASSETS

PARTS = ASSETS / "cpu" / "run-two-nodes"
PRIVATE = "ROOT-PRIVATE-EXCEPTION-TEXT"


@pytest.fixture(autouse=True)
def _as_root():
    if os.geteuid() != 0:
        pytest.skip("another local user's files need root to make (setpriv to nobody)")


def _private_run(tmp_path: Path) -> Path:
    """Root's own run: a 0700 folder whose events carry text no other user may read."""
    private = tmp_path / "root-only"
    shutil.copytree(PARTS / "node1-vm", private / "run")
    private.chmod(0o700)
    events = private / "run" / "events" / "vm-13219.jsonl"
    marked = events.read_text().replace('"kind": "progress"', f'"kind": "progress", "note": "{PRIVATE}"', 1)
    events.write_text(marked)
    events.chmod(0o600)
    return private / "run" / "events"


def _nobodys_part(shared: Path, name: str, events_link: Path) -> None:
    """A copy of node1's part, made nobody's, with `events` a link to `events_link`."""
    part = shared / name
    shutil.copytree(PARTS / "node1-vm", part, ignore=shutil.ignore_patterns("events"))
    subprocess.run(["chown", "-R", "65534:65534", str(part)], check=True)
    as_nobody(f"ln -s {events_link} {part}/events")


def _merged_text(folder: Path) -> str:
    return "".join(p.read_text(errors="replace") for p in folder.iterdir() if p.is_file())


def test_another_users_part_in_a_shared_run_folder_is_not_read(tmp_path, shared):
    events = _private_run(tmp_path)
    run_folder = shared / "run"
    shutil.copytree(PARTS, run_folder, ignore=shutil.ignore_patterns("merged.report.json", "node1-vm"))
    run_folder.chmod(0o1777)
    _nobodys_part(run_folder, "node1-vm", events)
    done = run_main_here(tmp_path, ["merge", str(run_folder)])
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-2000:]
    report = json.loads((run_folder / "report.json").read_text())
    (damaged,) = [f for r in report["results"] for f in r["findings"] if f["code"] == "node-part-damaged"]
    assert damaged["evidence"]["parts"][0]["part"] == "node1-vm"
    assert "belongs to nobody (uid 65534)" in damaged["evidence"]["parts"][0]["why"]
    assert PRIVATE not in _merged_text(run_folder) + done.stdout


def test_a_run_folder_of_another_user_is_refused_before_anything_is_read(tmp_path, shared):
    """nobody's own run folder, with a part whose `events` links into root's private run: the merged
    report would go into nobody's folder, so root's merge refuses it before reading any part (the
    link itself is never followed either: tests/unit/test_run_nodes_judge.py)."""
    events = _private_run(tmp_path)
    as_nobody(f"mkdir -m 755 {shared}/theirs")
    run_folder = shared / "theirs"
    shutil.copytree(PARTS / "node0-vm", run_folder / "node0-vm")
    subprocess.run(["chown", "-R", "65534:65534", str(run_folder)], check=True)
    _nobodys_part(run_folder, "node1-vm", events)
    done = run_main_here(tmp_path, ["merge", str(run_folder), "--json"])
    assert done.returncode == 2 and "owned by nobody (uid 65534)" in done.stderr, done.stderr[-2000:]
    assert done.stdout == "" and len(done.stderr.splitlines()) == 1
    assert PRIVATE not in done.stderr + _merged_text(run_folder)
