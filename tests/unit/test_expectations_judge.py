"""The judge of `dflashdoctor.testing`'s blocks, on blocks recorded from real runs (this CPU, and an
H200 for the dense backward), in this process: findings, causes, the failure message, the summary.

tests/assets/observations/record_blocks.py made each `block-*.json`.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from dflashdoctor.judges.expectations import dense_findings, fallback_findings, overlap_findings
from dflashdoctor.observations import BlockObservations, load
from dflashdoctor.pytest_plugin import summary_lines
from dflashdoctor.testing.message import message
from tests.unit.recorded import ASSETS

DRAFTER_LAYERS = [f"layers.{i}.self_attn" for i in range(5)]  # the qwen27b-dflash drafter's five

CASES = {
    "dense-forward": "cpu/block-raw-call, cpu/block-eager-wrapper-drafter, h200/block-eager-wrapper-drafter",
    "dense-backward": "h200/block-raw-call, h200/block-eager-wrapper-drafter",
    "recompile-limit-fallback": "cpu/block-recompile-limit, cpu/block-recompile-limit-before",
    "dynamo-skip-fallback": "cpu/block-skipped-frame",
    "concurrent-autotuner-entry": "cpu/block-shared-autotuner",
}


def block(name: str, **changes: object) -> BlockObservations:
    recorded = load(BlockObservations, json.loads((ASSETS / f"{name}.json").read_text(encoding="utf-8"))["block"])
    return dataclasses.replace(recorded, **changes)


def test_a_raw_call_is_dense_forward_at_its_line_never_compiled():
    (found,) = dense_findings(block("cpu/block-raw-call"))
    assert (found.code, found.severity) == ("dense-forward", "error")
    assert found.where.function == "block" and found.where.file.endswith("record_blocks.py")
    assert "q [1, 2, 256, 64] kv [1, 2, 256, 64] float32 on cpu, on thread MainThread" in found.detail
    assert "score matrix of 0.5 MiB" in found.detail and "Cause: never compiled" in found.detail
    assert "torch.compile(flex_attention)" in found.fix


def test_a_dense_call_on_another_thread_names_that_thread():
    (found,) = dense_findings(block("cpu/block-dense-on-a-thread"))
    assert "on thread loader-3" in found.detail


def test_the_eager_wrapper_drafter_is_dense_at_each_of_its_five_layers():
    findings = dense_findings(block("cpu/block-eager-wrapper-drafter"))
    assert [f.where.module for f in findings] == DRAFTER_LAYERS
    assert all(f.where.file.endswith("reference/drafter.py") and f.where.function == "forward" for f in findings)
    assert all("Cause: eager backend" in f.detail and "default backend" in f.fix for f in findings)


def test_on_the_h200_each_dense_backward_is_charged_to_its_forward_layer():
    """A dense backward runs on autograd's device thread, with no user frame: its site comes from
    the forward, through the autograd ctx they share."""
    findings = dense_findings(block("h200/block-eager-wrapper-drafter"))
    by_kind = {kind: [f for f in findings if f.code == f"dense-{kind}"] for kind in ("forward", "backward")}
    assert [f.where.module for f in by_kind["forward"]] == DRAFTER_LAYERS
    assert sorted(f.where.module for f in by_kind["backward"]) == DRAFTER_LAYERS
    for f in by_kind["backward"]:
        assert f.title.endswith("(the backward of the forward called there)")
        assert "bfloat16 on cuda:0" in f.detail and "Cause: eager backend" in f.detail
        assert "on autograd's engine thread (Dummy-" in f.detail  # not the thread that called backward()


def test_on_the_h200_a_raw_backward_is_dense_at_the_forward_line():
    findings = dense_findings(block("h200/block-raw-call"))
    assert [f.code for f in findings] == ["dense-forward", "dense-backward"]
    assert findings[0].where == findings[1].where
    assert all("Cause: never compiled" in f.detail for f in findings)


def test_the_healthy_drafter_on_the_h200_is_fused():
    healthy = block("h200/block-healthy-drafter")
    assert not healthy.dense_events and not dense_findings(healthy) and not fallback_findings(healthy)


@pytest.mark.parametrize(("name", "when"), [("recompile-limit", "during"), ("recompile-limit-before", "before")])
def test_a_recompile_limit_names_its_guard(name, when):
    recorded = block(f"cpu/block-{name}")
    (dense,) = dense_findings(recorded)
    assert "Cause: recompile limit" in dense.detail and "global __main__.OFFSET" in dense.detail
    (fallback,) = fallback_findings(recorded)
    assert fallback.code == "recompile-limit-fallback"
    assert fallback.title == "Recompile limit (2) hit: dynamo runs `flex_attention` eagerly from now on"
    assert fallback.where.file.endswith("record_blocks.py") and fallback.where.function == "_shifted"
    assert f"It gave up {when} this block; 1 dense flex_attention call in the block ran under it." in fallback.detail
    assert "fail_on_recompile_limit_hit" in fallback.fix


def test_a_skipped_frame_names_the_exception():
    recorded = block("cpu/block-skipped-frame")
    (fallback,) = fallback_findings(recorded)
    assert fallback.code == "dynamo-skip-fallback"
    assert "raised ValueError('Expect query and key/value to have the same number of heads" in fallback.detail
    assert all("Cause: skipped frame" in f.detail for f in dense_findings(recorded))


def test_no_fallback_without_a_record_of_one():
    raw = block("cpu/block-raw-call")
    assert not fallback_findings(raw)
    unexplained = block("cpu/block-recompile-limit-before", earlier_compiles=[])
    assert not fallback_findings(unexplained)  # dense under a wrapper, but no record says why
    (dense,) = dense_findings(unexplained)
    assert "a compiled wrapper ran flex_attention as plain Python" in dense.detail


def test_dynamo_disabled_is_the_cause_when_set():
    (dense,) = dense_findings(block("cpu/block-raw-call", dynamo_disabled=True))
    assert "Cause: dynamo disabled" in dense.detail and "TORCHDYNAMO_DISABLE" in dense.fix


def test_two_threads_in_one_autotuner():
    (found,) = overlap_findings(block("cpu/block-shared-autotuner"))
    assert found.code == "concurrent-autotuner-entry"
    assert "Threads pair-0 and pair-1" in found.detail and "`add_kernel`" in found.title


def test_the_message_is_safe_for_a_terminal_whatever_the_path_holds():
    recorded = block("cpu/block-raw-call")
    event = recorded.dense_events[0]
    event.site = {**event.site, "file": "/tmp/\x1b[2Jcleared/\udce9model.py"}
    event.layer = "layers.0\x07"
    text = message("headline", dense_findings(recorded))
    assert "\x1b" not in text and "\x07" not in text and "\udce9" not in text
    assert "/tmp/\\x1b[2Jcleared/\\xe9model.py" in text and "(layers.0\\x07)" in text
    text.encode("utf-8")


def test_the_summary_counts_sites_and_tests():
    """The CPU and the H200 recordings ran the same drafter line: one site per layer, both tests."""
    forward = dense_findings(block("cpu/block-eager-wrapper-drafter"))
    both = dense_findings(block("h200/block-eager-wrapper-drafter"))
    lines = summary_lines([("t.py::a", forward), ("t.py::b", both), ("t.py::c", [])])
    assert lines[0] == "3 tests watched; flex_attention ran its dense kernel in 2 of them, from 5 call sites"
    (first,) = (line for line in lines if "(layers.0.self_attn)" in line)
    assert first.endswith("drafter.py:49 in forward (layers.0.self_attn): forward 2, backward 1 (t.py::a, t.py::b)")


def test_every_recording_loads(tmp_path: Path):
    for path in sorted(ASSETS.glob("*/block-*.json")):
        recorded = block(f"{path.parent.name}/{path.stem}")
        assert isinstance(recorded, BlockObservations)
