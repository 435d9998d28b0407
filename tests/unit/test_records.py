"""The records the probes write are the ones the judges read: each probed-side object that writes a
record (its `to_dict`) writes exactly the keys of its records.py class, so a field added, dropped or
renamed on either side fails here, before a recording or a GPU run would show it."""

from __future__ import annotations

import typing
from dataclasses import asdict
from types import SimpleNamespace

import pytest

from dflashdoctor import records
from dflashdoctor.autotune.audit import ClassAudit
from dflashdoctor.autotune.trials import ThreadError, Trial
from dflashdoctor.call_plan import CallPlan
from dflashdoctor.fla_guards import FlaGuard
from dflashdoctor.hooks import dynamo_watch
from dflashdoctor.hooks.autotuner_guard import ConcurrentEntry
from dflashdoctor.hooks.fix_replay import ReplayOutcome
from dflashdoctor.hooks.flex_calls import FlexSite
from dflashdoctor.hooks.hf_attention import SiteRecord
from dflashdoctor.observations import DenseEvent
from dflashdoctor.targets import TargetInfo


def _keys(record: type) -> set[str]:
    return set(typing.get_type_hints(record, vars(records), include_extras=True))


WRITERS = {
    "TargetRecord": lambda: TargetInfo("m:f", "function", "f", None, None, None).to_dict(),
    "TrialRecord": lambda: Trial(forced=True, fix="none", threads=2).to_dict(),
    "ThreadErrorRecord": lambda: asdict(ThreadError("t", "ValueError", "m", "f:1 in g", "")),
    "ClassAuditRecord": lambda: ClassAudit(cls="triton.runtime.autotuner.Autotuner", audited=True).to_dict(),
    "ConcurrentEntryRecord": lambda: ConcurrentEntry("k", ["a", "b"], [[], []], [True, None], False).to_dict(),
    "FlexSiteRecord": lambda: FlexSite(file="f.py", line=1, function="g", module=None, via="raw").to_dict(),
    "ModuleSiteRecord": lambda: SiteRecord(module="m", module_class="C", impl="sdpa").to_dict(),
    "FlaGuardRecord": lambda: FlaGuard("f.py", 1, "g", "refused").to_dict(),
    "CallPlanRecord": lambda: CallPlan().to_dict(),
    "DenseEventRecord": lambda: DenseEvent("forward", "p", [1], [1], "float32", "cpu", 4, None).to_dict(),
    "FixReplayRecord": lambda: ReplayOutcome(
        site=None, forward_site=None, layer=None, stack=[], device="cpu"
    ).to_dict(),
}


@pytest.mark.parametrize("name", sorted(WRITERS))
def test_a_writer_writes_the_keys_of_its_record(name):
    assert set(WRITERS[name]()) == _keys(getattr(records, name))


def test_a_compile_record_reads_torchs_metrics_each_of_its_type():
    """Each field of the record from torch's CompilationMetrics; one missing or of another type is None."""
    metrics = SimpleNamespace(compile_id="0/1", co_firstlineno=7, entire_frame_compile_time_s=2, num_graph_breaks="1")
    record = dynamo_watch._record(metrics, "target:first")
    assert set(record) == _keys(records.CompileRecord)
    read = ("phase", "compile_id", "co_firstlineno", "entire_frame_compile_time_s", "num_graph_breaks", "co_name")
    assert [record[k] for k in read] == ["target:first", "0/1", 7, 2, None, None]


def test_the_records_use_no_any():
    """No record leaves a value a judge reads untyped."""
    for name, record in vars(records).items():
        if typing.is_typeddict(record):
            hints = typing.get_type_hints(record, vars(records), include_extras=True)
            assert "Any" not in repr(hints), name


def test_every_phase_a_probe_recorded_is_one_records_names():
    """The phase names are no string protocol of two files: what the probe wrote on a CPU and on an
    H200 is read back by records.Phase, the only place that spells them."""
    from tests.unit.recorded import ASSETS, raw

    named = {records.Phase.FIRST, records.Phase.EAGER, records.Phase.NUMERICS, records.Phase.REFERENCE}
    seen = set()
    for path in sorted(ASSETS.glob("*/check-compile-*.json")):
        if path.name.endswith("report.json"):
            continue
        for phase in raw(f"{path.parent.name}/{path.stem}")["phases"]:
            forward = phase.removesuffix(":backward")
            assert forward in named or records.Phase.is_warm(phase) or forward.startswith("vary:"), phase
            seen.add(phase)
    assert {records.Phase.backward(records.Phase.FIRST), records.Phase.warm(0), records.Phase.EAGER} <= seen
