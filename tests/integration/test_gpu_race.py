"""race with real FLA kernels on a GPU: threads crash the shared autotuners, each fix holds.

Run on a CUDA machine with fla-core importable (`python -m pytest -m gpu`). With two GPUs the
threads run one per GPU, as the original data-parallel pairs did; with one, both share it (the
autotuners are shared either way: they are module globals). The tests share one folder of compiled
binaries, so only the first trial compiles; every trial still tunes cold (checked in each), and the
trials of one run share a trial host.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from tests.conftest import CliRun, run_cli

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(importlib.util.find_spec("fla") is None, reason="needs fla-core"),
]


@pytest.fixture(scope="module")
def binaries(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("triton-binaries")


@pytest.fixture
def race(evidence, binaries):
    def invoke(*args: str) -> CliRun:
        return run_cli(evidence, "race", "--triton-binaries", str(binaries), "--timeout", "580", *args, timeout=600)

    return invoke


def _tuned_cold(run: CliRun) -> list[dict]:
    """Trials share a trial host: none stored a tuning result on disk, each benchmarked its kernels,
    and each after the first cleared what the one before had tuned."""
    trials = run.report["results"][0]["measurements"]["kernel_trials"]
    assert all(t["tuning_results_on_disk"] == 0 and t["entered_warm"] == [] for t in trials)
    assert all(t["benchmarked"] for t in trials)
    assert all(t["tuning_entries_cleared"] > 0 for t in trials if not t["fresh_process"])
    assert run.check("cold tuning")["status"] == "pass"
    return trials


def test_fla_threads_crash_the_shared_autotuner(race):
    run = race("--kernel", "fla", "--trials", "2")
    assert run.code == 1, run.stdout + run.stderr
    failed = [t for t in _tuned_cold(run) if t["failed"]]
    assert failed, "no trial failed"
    (found,) = run.findings("autotuner-race")
    assert found["evidence"]["versions"]["fla"]
    assert "autotuner.py" in found["evidence"]["failing_frame"]
    # Named where it is actionable: the FLA line that launched the kernel, and the kernel itself.
    assert "/fla/" in found["where"]["file"] and found["evidence"]["kernel"]
    reached = run.report["results"][0]["measurements"]["autotuners_reached"]
    assert "l2norm_fwd_kernel" in reached and len(reached) >= 6
    live = run.report["results"][0]["measurements"]["live_autotuners"]
    assert {"CachedAutotuner"} <= {k["class"] for k in live} and len(live) >= 6


@pytest.mark.parametrize("fix", ["lock", "sequential"])
def test_fla_fix_holds_with_equal_outputs(race, fix):
    run = race("--kernel", "fla", "--trials", "1", "--fix", fix)
    assert run.code == 0, run.stdout + run.stderr
    trials = _tuned_cold(run)
    assert all(not t["failed"] and t["outputs_equal"] is True for t in trials)
    assert "autotuner-race" not in run.codes()


def test_reference_concurrent_target_forwards_are_caught(race):
    """Concurrent pairs either crash the autotuner or, when a run happens not to, the guard still
    reports the two threads inside one autotuner."""
    run = race("--kernel", "reference", "--trials", "2")
    assert run.check("reference setup")["status"] == "pass"  # the target's layers reach FLA's kernels
    assert "concurrent" in run.check("reference setup")["summary"]
    assert run.codes() & {"autotuner-race", "concurrent-autotuner-entry"}


def test_reference_sequential_target_forwards_are_clean(race):
    run = race("--kernel", "reference", "--trials", "1", "--fix", "sequential")
    assert run.code == 0, run.stdout + run.stderr
    assert all(not t["failed"] and t["concurrent_entries"] == [] for t in _tuned_cold(run))
    assert "sequential" in run.check("reference setup")["summary"]
