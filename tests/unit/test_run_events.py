"""`run`'s event lines read back as records.py types them: every line the agent wrote in the
recorded runs is of its kind's type, and a line that is not (a hostile or damaged one, or a snapshot
whose observations are not a RunSnapshot) is a damaged line, with nothing of it kept."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dflashdoctor.observations import DenseEvent, RunSnapshot
from dflashdoctor.runs.events import ProcessLog, read_logs
from tests.unit.recorded import ASSETS

EVENT_FOLDERS = sorted({path.parent for path in ASSETS.glob("**/*.jsonl")})


@pytest.mark.parametrize("folder", EVENT_FOLDERS, ids=[str(f.relative_to(ASSETS)) for f in EVENT_FOLDERS])
def test_every_recorded_event_line_is_of_its_type(folder):
    logs = read_logs(folder)
    assert logs and [log.damaged_lines for log in logs] == [0] * len(logs)
    for log in logs:
        assert log.start is not None and log.exit is not None, log.label
        assert log.snapshot is None or isinstance(log.snapshot.observations, RunSnapshot)


def _records(kind: str) -> list[dict]:
    """The lines of the first recorded process that wrote a `kind` line."""
    for path in sorted(ASSETS.glob("**/*.jsonl")):
        records = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
        if any(r["kind"] == kind for r in records):
            return records
    raise AssertionError(f"no recorded {kind} line")


def _read(tmp_path: Path, records: list[dict]) -> tuple[int, ProcessLog]:
    (tmp_path / "vm-4242.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    (log,) = read_logs(tmp_path)
    return log.damaged_lines, log


_KEPT = {  # how many lines of a kind a process's log kept
    "start": lambda log: int(log.start is not None),
    "exit": lambda log: int(log.exit is not None),
    "step": lambda log: len(log.steps),
    "dense": lambda log: len(log.dense),
}


def _changed(kind: str, change) -> list[dict]:
    """A recorded process's lines, each pid made 4242, its first line of `kind` changed."""
    records = _records(kind)
    for record in records:
        record["pid"] = 4242
    change(next(r for r in records if r["kind"] == kind))
    return records


def _first_time(records: list[dict], kind: str) -> float:
    return next(r["t"] for r in records if r["kind"] == kind)


@pytest.mark.parametrize(
    ("kind", "change"),
    [
        ("start", lambda r: r.update(argv="python train.py")),  # a string, not a list
        ("start", lambda r: r.pop("cwd")),
        ("step", lambda r: r.update(step=-1)),
        ("step", lambda r: r.update(kind=["step"])),  # a kind no table can look up
        ("step", lambda r: r.update(memory={"cuda:0": {"peak_bytes": "many"}})),
        ("dense", lambda r: r["event"].update(score_matrix_bytes=1.5)),
        ("dense", lambda r: r["event"].update(extra=1)),
        ("snapshot", lambda r: r["observations"].update(steps="3")),
        ("snapshot", lambda r: r["observations"].update(unknown_key=[])),
        ("snapshot", lambda r: r["observations"]["traced_script"].pop("flex_sites")),
        ("exit", lambda r: r.update(t=float("inf"))),
    ],
)
def test_a_line_not_of_its_type_is_damaged_and_nothing_of_it_is_kept(tmp_path, kind, change):
    clean_damaged, clean = _read(tmp_path, _changed(kind, lambda r: None))
    damaged, log = _read(tmp_path, _changed(kind, change))
    assert (clean_damaged, damaged) == (0, 1)
    if kind == "snapshot":  # the damaged snapshot is not the one kept
        assert clean.snapshot is not None
        assert log.snapshot is None or log.snapshot.t != _first_time(_records(kind), kind)
    else:
        assert _KEPT[kind](log) == _KEPT[kind](clean) - 1
    if kind == "start":
        assert log.argv is None


def test_a_batch_written_at_once_reads_back_line_by_line_without_the_record_that_did_not_encode(tmp_path):
    """The agent writes a batch of dense kernels in one write (one system call, not one a line); each
    is its own line for the reader, and a record that cannot be encoded (a value that refers to
    itself) is counted and left out, not the batch with it."""
    from dflashdoctor.agent.events import EventLog

    log = EventLog(str(tmp_path))
    looped: list[object] = []
    looped.append(looped)
    log.write("start", argv=["train.py"], executable="python3", ppid=1, cwd="/", python="3.11", env={})
    kernels = [
        {
            "t": 1.0 + i,
            "event": DenseEvent(
                "forward", "", [1, 2, 4, 8], [1, 2, 4, 8], "float32", "cpu", 0, None, layer=f"layers.{i}"
            ).to_dict(),
        }
        for i in range(3)
    ]
    log.write_all("dense", [kernels[0], {"t": 9.0, "event": looped}, *kernels[1:]])
    log.write("exit", ending="exit", event_write_failures=log.failures)
    (process,) = read_logs(tmp_path)
    assert log.failures == 1 and process.damaged_lines == 0
    assert [(d["t"], d["layer"]) for d in process.dense] == [(1.0, "layers.0"), (2.0, "layers.1"), (3.0, "layers.2")]
