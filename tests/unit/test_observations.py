"""observations.json: what a probe saw, kept beside the report and loaded back as typed observations.
It never enters report.json or --json's stdout, survives any path a filesystem can hold, and a
document of the wrong shape is one clear error, never a crash inside a judge's loader."""

from __future__ import annotations

import json
import math
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dflashdoctor.observations import (
    BlockObservations,
    CheckCompileObservations,
    DenseEvent,
    ObservationsError,
    TraceAttentionObservations,
    dump,
    load,
)
from dflashdoctor.registry import PROBES
from dflashdoctor.report import Report
from tests.unit.recorded import ASSETS, raw


def test_observations_stay_out_of_the_report_and_its_json():
    report = Report(command="check-compile", argv=[], started="now")
    report.observations["check-compile"] = raw("cpu/check-compile-healthy")
    assert "observations" not in report.to_dict() and "observations" not in json.loads(report.to_json())
    assert Report.from_json(report.to_json()).observations == {}


def test_a_path_no_encoding_can_show_and_a_nan_come_back_as_they_went():
    path = "/tmp/\udcff\udcfe-cache/\x1b[31mkernel.py"  # undecodable bytes, an escape sequence
    report = Report(command="trace-attention", argv=[], started="now")
    report.observations["trace-attention"] = {"traced_script": {"script": path, "sites": []}, "numerics": math.nan}
    text = report.observations_json()
    assert text.isascii()  # whatever the terminal or the file's reader, the document is plain ASCII
    back = json.loads(text)["probes"]["trace-attention"]
    assert back["traced_script"]["script"] == path and math.isnan(back["numerics"])


def _as_recorded(value, recorded):
    """`value` cut to the keys the recording holds, at every depth: fields added since it was made
    (with their defaults) are not what the probe wrote."""
    if isinstance(value, dict) and isinstance(recorded, dict):
        return {k: _as_recorded(value[k], recorded[k]) for k in recorded}
    if isinstance(value, list) and isinstance(recorded, list) and len(value) == len(recorded):
        return [_as_recorded(v, r) for v, r in zip(value, recorded, strict=True)]
    return value


def test_a_recording_loads_typed_and_dumps_back_to_what_the_probe_wrote():
    data = raw("cpu/check-compile-raw-call")
    observations = load(CheckCompileObservations, data)
    assert all(isinstance(e, DenseEvent) for e in observations.dense_events) and observations.dense_events
    assert observations.vary[0].kv_len > 0
    again = dump(observations)
    assert _as_recorded(again, data) == data


def test_not_strict_a_key_this_version_does_not_know_is_ignored_and_a_missing_one_defaults():
    """How `judges/run.py` reads a part it built, and how a file kept from another version loads."""
    observations = load(TraceAttentionObservations, {"device": "cuda", "from_a_later_version": [1, 2]})
    assert observations.device == "cuda" and observations.dense_events == [] and observations.parts() == []


def test_every_recording_loads_strictly():
    """What the probes wrote, at every depth, has the keys and types the judges read: no key
    unknown, none missing (tests/assets/observations/upgrade.py filled those added since)."""
    loaded = 0
    for path in sorted(ASSETS.glob("*/*.json")):
        if path.name.endswith("report.json"):
            continue
        document = json.loads(path.read_text(encoding="utf-8"))
        if "block" in document:
            load(BlockObservations, document["block"], strict=True)
            loaded += 1
            continue
        for probe, data in document["probes"].items():
            if probe not in ("run", "cache"):  # the doctor's own; read by their own readers
                load(PROBES[probe].observations, data, strict=True)
                loaded += 1
    assert loaded >= 40


def _renamed(data: dict, path: list, old: str, new: str) -> dict:
    """`data` with the key `old` of the record at `path` renamed, as a probe's edit would."""
    copy = json.loads(json.dumps(data))
    record = copy
    for step in path:
        record = record[step]
    record[new] = record.pop(old)
    return copy


@pytest.mark.parametrize(
    ("path", "old", "message"),
    [
        ([], "vary", "CheckCompileObservations: unknown key 'vary_calls'"),
        (["phases", "target:first"], "wall_s", "CheckCompileObservations.phases['target:first']: unknown key"),
        (["compiles", 0], "recompile_reason", "CheckCompileObservations.compiles[0]: unknown key"),
        (["target"], "backends", "CheckCompileObservations.target: unknown key 'backends_calls'"),
        (["dense_events", 0], "thread", "CheckCompileObservations.dense_events[0]: unknown key"),
    ],
)
def test_strict_a_renamed_key_is_an_error_naming_where(path, old, message):
    data = _renamed(raw("cpu/check-compile-raw-call"), path, old, f"{old}_calls")
    assert load(CheckCompileObservations, data).device == "cpu"  # not strict: judged on a default
    with pytest.raises(ObservationsError, match=re.escape(message)):
        load(CheckCompileObservations, data, strict=True)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d.pop("oom"), "CheckCompileObservations: missing 'oom'"),
        (lambda d: d["compiles"][0].pop("guard_file"), "compiles[0]: missing 'guard_file'"),
        (lambda d: d.update(graph_breaks=3), "graph_breaks: expected dict, got int"),
        (lambda d: d["vary"][0].update(kv_len=True), "vary[0].kv_len: expected int, got bool"),
        (lambda d: d["phases"]["eager"].update(wall_s="1.0"), "['eager']['wall_s']: expected float, got str"),
        (lambda d: d["target"].update(rebound={"name": "f"}), "target['rebound']: missing"),
    ],
)
def test_strict_a_missing_key_or_another_type_is_an_error(change, message):
    data = json.loads(json.dumps(raw("cpu/check-compile-raw-call")))
    change(data)
    with pytest.raises(ObservationsError, match=re.escape(message)):
        load(CheckCompileObservations, data, strict=True)


def test_strict_a_record_may_lack_only_what_its_probe_leaves_out():
    """A phase that ran out of memory has no call time (records.PhaseRecord: NotRequired)."""
    data = json.loads(json.dumps(raw("cpu/check-compile-raw-call")))
    del data["phases"]["target:first"]["forward_s"]
    assert "forward_s" not in load(CheckCompileObservations, data, strict=True).phases["target:first"]


@pytest.mark.parametrize(
    "data",
    [
        [],  # not an object
        {"dense_events": [{"kind": "forward"}]},  # an event without its shape
        {"dense_events": ["forward"]},
        {"vary": [12]},
    ],
)
def test_the_wrong_shape_is_an_observations_error(data):
    with pytest.raises(ObservationsError):
        load(CheckCompileObservations, data)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=12,
)
fields = st.sampled_from(["dense_events", "vary", "shape", "phases", "oom", "compiles", "target", "device"])


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(fields | st.text(max_size=8), json_values, max_size=6))
def test_loading_any_json_object_returns_or_says_why(data):
    for strict in (False, True):
        try:
            load(CheckCompileObservations, data, strict=strict)
        except ObservationsError as exc:
            assert str(exc).startswith("CheckCompileObservations")
