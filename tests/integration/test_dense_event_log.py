"""`run`'s dense-kernel lines: a new kind of kernel is on disk at once, a repeat waits to be written
with the next line due, and every line says when its kernel ran and what was known then."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dflashdoctor.agent import torch_instruments
from dflashdoctor.agent.config import RunSettings
from dflashdoctor.agent.process import ProcessAgent
from dflashdoctor.agent.torch_instruments import TorchInstruments
from dflashdoctor.observations import DenseEvent


def _event(line: int, layer: str = "layers.0") -> DenseEvent:
    return DenseEvent(
        kind="forward",
        phase="",
        q_shape=[1, 4, 64, 16],
        kv_shape=[1, 4, 64, 16],
        dtype="float32",
        device="cpu",
        score_matrix_bytes=65536,
        site={"file": "/train.py", "line": line, "function": "forward", "module": "train"},
        route="raw",
        layer=layer,
    )


def _dense_lines(folder: Path) -> list[dict]:
    records = [json.loads(line) for path in folder.glob("*.jsonl") for line in path.read_text().splitlines()]
    return [record for record in records if record["kind"] == "dense"]


@pytest.fixture
def instruments(tmp_path: Path) -> TorchInstruments:
    return TorchInstruments(ProcessAgent(str(tmp_path), RunSettings()))


def test_a_new_kernel_is_written_at_once_and_a_repeat_with_the_next_line_due(tmp_path, instruments):
    first, repeat, other_layer = _event(10), _event(10), _event(10, layer="layers.1")
    instruments._dense_event(first)
    assert [r["event"]["layer"] for r in _dense_lines(tmp_path)] == ["layers.0"]
    instruments._dense_event(repeat)
    repeat.forward_site = {"file": "/train.py", "line": 10}  # filled in after its kernel ran
    assert len(_dense_lines(tmp_path)) == 1
    instruments._dense_event(other_layer)  # new: written, and the repeat before it
    lines = _dense_lines(tmp_path)
    assert [r["event"]["layer"] for r in lines] == ["layers.0", "layers.0", "layers.1"]
    assert [r["event"]["forward_site"] for r in lines] == [None, None, None]  # as when the kernel was about to run
    assert lines[0]["t"] <= lines[1]["t"] <= lines[2]["t"]
    assert instruments.dense_seen == 3


def test_repeats_are_written_by_a_snapshot_and_by_the_last_kernel_logged(tmp_path, instruments, monkeypatch):
    instruments._dense_event(_event(10))
    instruments._dense_event(_event(10))
    instruments.snapshot("step")
    assert len(_dense_lines(tmp_path)) == 2
    monkeypatch.setattr(torch_instruments, "_DENSE_LOGGED", 5)
    for _ in range(5):
        instruments._dense_event(_event(10))
    assert len(_dense_lines(tmp_path)) == 5  # the fifth was the last logged: nothing waits for a later one
    assert instruments.dense_seen == 7


def test_a_repeat_waits_at_most_the_batch_interval(tmp_path, instruments, monkeypatch):
    monkeypatch.setattr(torch_instruments, "_DENSE_BATCH_S", 0.0)
    instruments._dense_event(_event(10))
    instruments._dense_event(_event(10))
    assert len(_dense_lines(tmp_path)) == 2
