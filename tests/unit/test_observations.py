"""observations.json: what a probe saw, kept beside the report and loaded back as typed observations.
It never enters report.json or --json's stdout, survives any path a filesystem can hold, and a
document of the wrong shape is one clear error, never a crash inside a judge's loader."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dflashdoctor.observations import (
    CheckCompileObservations,
    DenseEvent,
    ObservationsError,
    TraceAttentionObservations,
    dump,
    load,
)
from dflashdoctor.report import Report
from tests.unit.recorded import raw


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


def test_a_key_this_version_does_not_know_is_ignored_and_a_missing_one_defaults():
    observations = load(TraceAttentionObservations, {"device": "cuda", "from_a_later_version": [1, 2]})
    assert observations.device == "cuda" and observations.dense_events == [] and observations.parts() == []


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
    try:
        load(CheckCompileObservations, data)
    except ObservationsError as exc:
        assert str(exc).startswith(("CheckCompileObservations", "DenseEvent", "VaryCall"))
