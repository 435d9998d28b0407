"""race on the CPU: a real triton Autotuner shared by threads, the interleaving forced; the fixes;
one process per worker over gloo; the guard's record of an overlap that did not crash.

The kernel runs in triton's interpreter, which the `triton.jit` decorator picks at import time, so
the in-process tests here run in a child process with TRITON_INTERPRET=1.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from dflashdoctor.autotune import stub_kernel
from tests.paths import ROOT, TARGETS

triton = pytest.importorskip("triton")


def test_two_threads_crash_the_shared_autotuner(cli_here):
    run = cli_here("race", "--threads", "2")
    assert run.code == 1, run.stdout + run.stderr
    (race,) = run.findings("autotuner-race")
    assert race["evidence"]["exception"] == "TypeError: 'NoneType' object is not a mapping"
    # Where: the line that launched the kernel; the failing frame inside triton is evidence.
    assert (race["where"]["file"], race["where"]["function"]) == (stub_kernel.__file__, "launch")
    assert race["evidence"]["failing_frame"].split(":")[0].endswith(os.path.join("triton", "runtime", "autotuner.py"))
    assert race["evidence"]["kernel"] == "add_kernel" and race["title"].endswith("(`add_kernel`)")
    assert set(race["evidence"]["stacks"]) == {"worker-0", "worker-1"}  # both threads' stacks
    assert race["evidence"]["versions"]["triton"] == triton.__version__
    assert any("triton-lang/triton/issues/3095" in ref for ref in race["refs"])
    (shared,) = run.findings("autotuner-shared-state")
    assert "_bench" in shared["evidence"]["per_call_state"]["nargs"]["read_by"]
    assert run.check("forced race")["status"] == "fail"


@pytest.mark.parametrize("fix", ["lock", "sequential"])
def test_fix_shows_no_failure_and_equal_outputs(cli_here, fix):
    run = cli_here("race", "--threads", "2", "--fix", fix, "--trials", "3")
    assert run.code == 0, run.stdout + run.stderr
    measurements = run.report["results"][0]["measurements"]
    assert measurements["forced_unfixed"]["failed"]  # the race is there without the fix
    fixed = measurements["forced_fixed"]
    assert fixed["errors"] == [] and fixed["outputs_equal"] is True
    assert measurements["natural_trials_failures"] == 0 and len(measurements["natural_trials"]) == 3
    entries = fixed["concurrent_entries"]
    assert (len(entries), entries[0]["serialized"]) == (1, True) if fix == "lock" else entries == []
    assert "autotuner-race" not in run.codes()


def test_one_process_per_worker_shares_no_autotuner(cli_here):
    run = cli_here("race", "--processes", "2", "--trials", "0")
    processes = run.report["results"][0]["measurements"]["processes"]
    assert processes["distinct_processes"] == 2 and processes["failures"] == 0
    assert len({rank["pid"] for rank in processes["ranks"]}) == 2
    assert run.check("processes")["status"] == "pass"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--threads", "1"], "--threads must be between 2 and 64 (a race needs two)"),
        (["--fix", "pray"], "unknown fix 'pray'; expected one of none, lock, sequential"),
        (
            ["--kernel", "flash"],
            "unknown kernel 'flash'; expected stub, fla, reference, or a TARGET module:attr / file.py:attr",
        ),
        (["--kernel", "no_such_module:fn"], "no module named 'no_such_module'"),
        (["--processes", "1"], "--processes must be 0 (off) or a whole number from 2 to 64"),
        (["--trials", "-1"], "--trials must be a whole number from 0 to 10000, not -1"),
        (["--triton-binaries", "."], "--triton-binaries is for real kernels (--kernel fla, reference or a TARGET)"),
    ],
)
def test_bad_race_options_exit_2(cli_here, args, message):
    run = cli_here("race", *args)
    assert run.code == 2
    assert run.stderr.strip() == f"dflashdoctor: {message}"


def test_binaries_folder_that_is_a_file_exits_2(cli_here, tmp_path):
    (tmp_path / "binaries").write_text("not a folder", encoding="utf-8")
    run = cli_here("race", "--kernel", "fla", "--triton-binaries", "binaries")
    assert run.code == 2
    assert run.stderr.strip() == "dflashdoctor: --triton-binaries binaries is not a directory"


SHARED_STUB = "dflashdoctor.autotune.stub_kernel:shared_add"


def test_target_trials_share_one_host_tune_cold_each_time_and_the_lock_holds(cli_here):
    """Three trials in one interpreter: before each, every autotuner is emptied (the second and
    third find the key the trial before tuned, and clear it), and each trial benchmarks its configs
    again; nothing is stored on disk."""
    run = cli_here("race", "--kernel", SHARED_STUB, "--trials", "3", "--fix", "lock")
    assert run.code == 0, run.stdout + run.stderr
    measurements = run.report["results"][0]["measurements"]
    trials = measurements["kernel_trials"]
    assert len(trials) == 3 and measurements["kernel_trials_failures"] == 0
    assert all(t["outputs_equal"] and t["fix"] == "lock" for t in trials)
    assert measurements["devices"] == ["cpu"]
    assert all(entry["serialized"] for t in trials for entry in t["concurrent_entries"])
    assert [t["fresh_process"] for t in trials] == [True, False, False]
    assert [t["tuning_entries_cleared"] for t in trials] == [0, 1, 1]
    assert [t["benchmarked"] for t in trials] == [{"add_kernel": 1}] * 3
    assert all(t["entered_warm"] == [] for t in trials)
    # The interpreter compiles nothing, so no trial found binaries; and no tuning result on disk.
    assert [t["binaries_cached"] for t in trials] == [False, False, False]
    assert all(t["tuning_results_on_disk"] == 0 for t in trials)
    cold = run.check("cold tuning")
    assert cold["status"] == "pass" and cold["summary"].endswith("3 trials tuned every key, in 1 process")
    assert measurements["autotuners_reached"] == ["add_kernel"]


@pytest.mark.parametrize(
    ("fault", "message"),
    [("killed", "killed by SIGKILL"), ("hangs", "timed out after 30 s")],
)
def test_a_trial_host_lost_mid_trial_is_a_failed_trial_and_the_next_starts_afresh(cli_here, fault, message):
    """SIGKILL, or a hang past the trial's time, in the second trial of a host: that trial fails as
    ProcessDied saying how it ended, and the third runs in a fresh host (which imports the workload
    again) and passes."""
    target = f"{TARGETS / 'race' / 'second_trial_faults.py'}:{fault}"
    run = cli_here("race", "--kernel", target, "--trials", "3", "--fix", "lock", "--timeout", "120")
    assert run.code == 1, run.stdout + run.stderr
    trials = run.report["results"][0]["measurements"]["kernel_trials"]
    assert [t["failed"] for t in trials] == [False, True, False]
    assert [t["fresh_process"] for t in trials] == [True, False, True]
    (died,) = trials[1]["errors"]
    assert died["type"] == "ProcessDied" and died["message"].startswith(message), died["message"]
    assert run.check("kernel trials")["summary"].startswith("1 of 3 trials (each tuning cold) failed")
    assert run.check("cold tuning")["summary"].endswith("in 2 processes")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks what happens without a GPU")
def test_fla_kernels_without_a_gpu_say_why(cli_here):
    run = cli_here("race", "--kernel", "fla")
    assert run.code == 0, run.stdout + run.stderr
    assert run.check("real kernels")["status"] == "skip"
    assert "need a CUDA GPU" in run.check("real kernels")["summary"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks what happens without a GPU")
def test_reference_target_forwards_without_a_gpu_say_why(cli_here):
    run = cli_here("race", "--kernel", "reference", "--fix", "sequential")
    assert run.code == 0, run.stdout + run.stderr
    summary = run.check("real kernels")["summary"]
    assert "the reference target's gated DeltaNet layers (FLA's kernels) need a CUDA GPU" in summary
    assert run.report["environment"]["target"] == "reference kernel, 2 threads, fix sequential"


def test_reference_target_forward_is_deterministic_per_pair():
    """Each pair owns a seeded target and inputs: a repeat call equals the first, pairs differ, and
    the target keeps the 27B's layer pattern (gated DeltaNet, then full attention)."""
    from dflashdoctor.reference import target_pairs

    first, again, other = (target_pairs.target_forward(w, "cpu") for w in (0, 0, 1))
    assert first.shape == (1, target_pairs.TOKENS, 192)
    assert torch.equal(first, again) and not torch.equal(first, other)
    info = target_pairs.model_info("cpu")
    assert info["layer_types"] == ["linear_attention"] * 3 + ["full_attention"]
    assert info["linear_attention"] in ("torch fallback", "fla kernel")
    assert target_pairs.describe("none") == "reference target forwards: concurrent"
    assert target_pairs.describe("sequential") == "reference target forwards: sequential"


def _in_child(code: str) -> dict:
    """Run `code` (which prints one JSON line last) with the interpreter on, in a fresh process."""
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_guard_records_an_overlap_that_did_not_crash():
    # Two warm calls overlap inside one autotuner: the first is held inside its kernel launch until
    # the second has run its whole call. Nothing crashes (warm calls read no shared state after the
    # launch), yet the guard names the kernel, both threads and both stacks.
    result = _in_child(
        """
        import json, threading
        from dflashdoctor.autotune.stub_kernel import autotuned_add, launch
        from dflashdoctor.hooks import AutotunerGuard

        tuner = autotuned_add(lambda: None)
        launch(tuner, 0)  # tunes the key: every later call is warm
        second_done = threading.Event()
        real = tuner.fn

        class HoldFirstLaunch:
            def __init__(self):
                self.first = True
            def run(self, *args, **kwargs):
                if self.first:
                    self.first = False
                    second_done.wait(10)
                return real.run(*args, **kwargs)
            def __getattr__(self, name):
                return getattr(real, name)

        tuner.fn = HoldFirstLaunch()
        errors = []

        def call(seed, done=None):
            try:
                launch(tuner, seed)
            except Exception as exc:
                errors.append(repr(exc))
            if done is not None:
                done.set()

        from triton.runtime.autotuner import Autotuner

        original = Autotuner.run
        with AutotunerGuard() as guard:
            first = threading.Thread(target=call, args=(1,), name="pair-0")
            first.start()
            while guard.calls_inside() < 1:
                pass
            second = threading.Thread(target=call, args=(2, second_done), name="pair-1")
            second.start()
            second.join(); first.join()
        (event,) = guard.events
        print(json.dumps({"errors": errors, "event": event.to_dict(), "restored": Autotuner.run is original}))
        """
    )
    assert result["errors"] == []
    event = result["event"]
    assert event["kernel"] == "add_kernel"
    assert event["threads"] == ["pair-0", "pair-1"]
    assert event["cold"] == [False, False]
    held, entering = event["stacks"]
    assert held[-1].endswith("in wait") and any(line.endswith("in run") for line in held)  # inside the launch
    assert any(line.endswith("in launch") for line in entering) and event["serialized"] is False
    assert result["restored"]


def test_audit_reads_per_call_state_and_a_subclass_lock():
    from dflashdoctor.autotune.audit import audit_class

    base = audit_class(triton.runtime.autotuner.Autotuner)
    assert base.audited and not base.locked
    assert "run" in base.per_call_state["nargs"]["written_by"]

    class LockedAutotuner(triton.runtime.autotuner.Autotuner):
        def run(self, *args, **kwargs):
            with self._lock:
                return super().run(*args, **kwargs)

    locked = audit_class(LockedAutotuner)
    assert (locked.base_run, locked.locked, locked.per_call_state) == (True, True, {})


@pytest.mark.skipif(importlib.util.find_spec("fla") is None, reason="needs fla-core installed")
def test_the_installed_classes_are_audited_from_their_files_without_importing_fla():
    """Importing FLA's autotuner module imports every FLA op (seconds of CPU in every race, and in
    every gate); the audit reads the same class from its file instead, in a fresh interpreter."""
    code = (
        "import json, sys\n"
        "from dflashdoctor.autotune.audit import audit_installed\n"
        "audits = [a.to_dict() for a in audit_installed()]\n"
        "print(json.dumps({'audits': audits, 'fla_imported': 'fla' in sys.modules}))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    result = json.loads(done.stdout)
    assert result["fla_imported"] is False
    base, fla = result["audits"]
    assert base["cls"] == "triton.runtime.autotuner.Autotuner" and base["audited"] and not base["locked"]
    assert "run" in base["per_call_state"]["nargs"]["written_by"]
    assert fla["cls"] == "fla.ops.utils.cache.CachedAutotuner" and fla["audited"] and fla["base_run"]
