"""race's judge on recorded observations: the stub's forced reproduction, FLA's kernels on an H200,
and the race judged for a pipeline by the gate's budgets."""

from __future__ import annotations

import pytest

from dflashdoctor.budgets import Budgets
from dflashdoctor.judges.race import judge
from dflashdoctor.observations import RaceObservations, load
from tests.unit.recorded import codes, documented, found, judged, judged_case, observations, raw


def _workload_error() -> list[dict]:
    """FLA's recorded trials, but each failing in the workload's own code: no thread inside an
    autotuner, none met in one (what a TARGET's bug looks like)."""
    trials = raw("h200/race-fla")["kernel_trials"]
    error = {
        "thread": "worker-1",
        "type": "IndexError",
        "message": "index 9 is out of bounds",
        "frame": "/u/train.py:12 in step",
        "traceback": 'Traceback ...\n  File "/u/train.py", line 12, in step\nIndexError',
        "kernel": None,
        "launch_site": None,
    }
    return [{**trial, "errors": [error], "concurrent_entries": [], "failed": True} for trial in trials]


CASES = {
    "autotuner-race": "cpu/race-stub",
    "autotuner-shared-state": "cpu/race-stub",
    "concurrent-autotuner-entry": "cpu/race-stub",
    "target-raised": ("h200/race-fla", {"kernel_trials": _workload_error()}),
}


@pytest.mark.parametrize("code", CASES)
def test_each_finding_from_a_recorded_run(code):
    (finding, *_) = documented(judged_case(CASES[code]), code)
    assert finding.refs or code == "target-raised"  # the workload's own error: no triton page to cite


def test_the_forced_race_names_the_kernel_and_the_launch():
    (race,) = found(judged("cpu/race-stub"), "autotuner-race")
    assert race.evidence["kernel"] == "add_kernel" and race.where.file.endswith("stub_kernel.py")


def test_fla_kernels_race_on_the_gpu():
    (result,) = judged("h200/race-fla")
    (race,) = found([result], "autotuner-race")
    assert result.status == "fail" and race.evidence["kernel"]
    assert result.measurements["kernel"] == "fla"


def test_a_pipeline_without_threaded_autotuners_gets_a_warning_with_the_reproduction():
    (result,) = judged("cpu/race-stub", budgets=Budgets(held_by_gate=True))
    assert not codes([result]) & {"autotuner-race", "concurrent-autotuner-entry"} and result.status == "pass"
    (shared,) = found([result], "autotuner-shared-state")
    assert shared.evidence["forced_reproduction"] and "threaded_autotuners = false" in shared.detail
    assert any(c.name == "forced race" and c.status == "warn" for c in result.checks)


def test_a_pipeline_with_threaded_autotuners_fails_on_the_race():
    (result,) = judged("cpu/race-stub", budgets=Budgets(held_by_gate=True, threaded_autotuners=True))
    assert "autotuner-race" in codes([result]) and result.status == "fail"


def test_overlap_in_runs_that_did_not_crash_is_an_error():
    entry = {
        "kernel": "add_kernel",
        "threads": ["worker-0", "worker-1"],
        "stacks": [["a.py:1 in run"], ["b.py:2 in run"]],
        "cold": [False, False],
        "serialized": False,
    }
    quiet = {"forced": False, "fix": "none", "threads": 2, "errors": [], "outputs_equal": True, "duration_s": 0.1}
    observations = {  # written out: a race seen in no crash, only in the guard's record
        "fix": "none",
        "threads": 2,
        "audit": [],
        "forced_unfixed": {**quiet, "forced": True, "concurrent_entries": [], "failed": False},
        "natural": [{**quiet, "concurrent_entries": [entry], "failed": False}],
    }
    (result,) = judge(load(RaceObservations, observations), Budgets())
    (overlap,) = [f for f in result.findings if f.code == "concurrent-autotuner-entry"]
    assert overlap.severity == "error" and overlap.evidence["event"]["threads"] == ["worker-0", "worker-1"]
    assert result.status == "fail"


def test_fla_trials_in_one_host_each_tuned_cold():
    """The H200 recording of three trials in one trial host: the later two cleared the keys the one
    before left, all six kernels benchmarked in each, and each crashed."""
    (result,) = judged("h200/race-fla")
    trials = result.measurements["kernel_trials"]
    assert [t["fresh_process"] for t in trials] == [True, False, False]
    assert [t["tuning_entries_cleared"] for t in trials] == [0, 6, 6]
    assert all(len(t["benchmarked"]) == 6 and t["failed"] for t in trials)
    cold = next(c for c in result.checks if c.name == "cold tuning")
    assert cold.status == "pass" and cold.summary.endswith("3 trials tuned every key, in 1 process")


def test_a_kernel_that_ran_without_benchmarking_makes_the_trials_not_cold():
    """A kernel with configs to choose from that a trial called without tuning (its choice came from a
    file or an earlier call) means that trial did not test the race: the check warns and names it."""
    recorded = observations("h200/race-fla")
    first = {**recorded.kernel_trials[0], "entered_warm": ["l2norm_fwd_kernel"]}
    (result,) = judged("h200/race-fla", kernel_trials=[first, *recorded.kernel_trials[1:]])
    cold = next(c for c in result.checks if c.name == "cold tuning")
    assert cold.status == "warn" and cold.summary.startswith("l2norm_fwd_kernel ran without benchmarking its configs")
