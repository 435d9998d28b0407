"""The run judge on recorded `dflashdoctor run -- CMD` observations and events: the CPU ones made
with the real CLI on tests/targets/run/ by tests/assets/observations/record_cache_run.py, and the
H200 out-of-memory run of reports/examples/h200-run-oom. Each finding code with the severity
codes.py gives it, on the line, module, process or exit status it is about."""

from __future__ import annotations

import pytest

from dflashdoctor.budgets import Budgets
from dflashdoctor.report import Check, ProbeResult
from tests.paths import TARGETS
from tests.unit.recorded import Case, codes, documented, found, judged, judged_case, raw

SCRIPTS = TARGETS / "run"

# a run whose command left a child running: the recorded exception run, as watch() now reports it
# (tests/integration/test_run_leftovers.py makes it for real)
_LEFT = {"pid": 4242, "command": "sleep 300"}
_LEFT_OUTCOME = {"returncode": 0, "duration_s": 1.0, "left_running": [_LEFT]}

# the recorded deadlock, as watch() reports it when the gate's run_timeout stopped it
_DEADLOCK = raw("cpu/run-deadlock")
_AT_DEADLINE = {**_DEADLOCK["outcome"], "hang": {**_DEADLOCK["outcome"]["hang"], "deadline_s": 30.0}}

CASES: dict[str, Case] = {
    "uncaught-exception": "cpu/run-raises",
    "hang": "cpu/run-deadlock",
    "child-failed": "cpu/run-exits-3",
    "run-interrupted": "cpu/run-interrupted",
    "oom": "h200/run-oom",
    "dense-forward": "cpu/run-eager-flex",
    "instrumentation-unavailable": "cpu/run-not-python",
    "processes-left-running": ("cpu/run-not-python", {"outcome": _LEFT_OUTCOME}),
    "run-timeout": ("cpu/run-deadlock", {"outcome": _AT_DEADLINE}),
}


def line_of(script: str, marker: str) -> int:
    lines = (SCRIPTS / script).read_text().splitlines()
    return next(i for i, text in enumerate(lines, 1) if f"# {marker}" in text)


def check(section: ProbeResult, name: str) -> Check:
    (match,) = [c for c in section.checks if c.name == name]
    return match


@pytest.mark.parametrize("code", CASES)
def test_each_code_is_found_with_its_documented_severity(code):
    assert documented(judged_case(CASES[code]), code)


def test_processes_left_running_fail_the_run_and_are_named():
    results = judged_case(CASES["processes-left-running"])
    (left,) = documented(results, "processes-left-running")
    assert "pid 4242: sleep 300" in left.detail and left.evidence["left_running"] == [_LEFT]
    assert any(c.name == "leftovers" and c.status == "fail" for r in results for c in r.checks)


def test_a_run_stopped_at_its_time_limit_says_so_not_hang_and_names_where_each_thread_was():
    results = judged_case(CASES["run-timeout"])
    assert "hang" not in codes(results)
    timeouts = documented(results, "run-timeout")
    assert timeouts and all("time limit of 30 s" in f.title for f in timeouts)
    assert any(f.where is not None and f.where.file.endswith("deadlock.py") for f in timeouts)
    assert check(results[0], "watchdog").status == "fail"


def test_an_exception_in_a_module_names_the_module_and_its_line():
    overview, process = judged(CASES["uncaught-exception"])
    (raised,) = found([process], "uncaught-exception")
    assert raised.title == "ValueError in blocks.1 on thread MainThread: block input has the wrong scale"
    assert raised.where.module == "blocks.1" and raised.where.function == "forward"
    assert raised.where.file.endswith("tests/targets/run/raises_in_module.py")
    assert raised.where.line == line_of("raises_in_module.py", "RAISE_LINE")
    assert raised.evidence["type"] == "ValueError" and raised.evidence["pid"] == process.measurements["pid"]
    assert raised.evidence["traceback"].startswith("Traceback (most recent call last):")
    assert process.status == "fail"
    assert [f.evidence["returncode"] for f in found([overview], "child-failed")] == [1]


def test_a_non_zero_exit_is_kept_and_fails_the_run():
    (overview,) = judged(CASES["child-failed"])  # no torch, no exception: no section of its own
    (failed,) = found([overview], "child-failed")
    assert failed.title == "The command exited with 3" and failed.evidence["returncode"] == 3
    assert failed.evidence["command"][-1].endswith("exits_3.py")
    exit_code = check(overview, "exit code")
    assert (exit_code.status, exit_code.codes) == ("fail", ["child-failed"])
    assert overview.measurements["returncode"] == 3 and codes([overview]) == {"child-failed"}


def test_the_watchdog_stops_a_deadlock_and_fails_the_run():
    overview = judged(CASES["hang"])[0]
    watchdog = check(overview, "watchdog")
    assert watchdog.status == "fail" and watchdog.codes == ["hang"]
    assert watchdog.summary.startswith("no progress for 4.")  # --hang-timeout 4
    assert check(overview, "exit code").status == "info"  # stopped by the doctor, not a child failure
    assert overview.status == "fail" and "child-failed" not in codes([overview])


def test_a_deadlock_names_both_threads_waiting_at_the_lock():
    results = judged(CASES["hang"])
    (hang,) = found(results, "hang")
    assert hang.evidence["tool"] in ("py-spy", "faulthandler")
    wait = f"deadlock.py:{line_of('deadlock.py', 'WAIT_LINE')} in take"
    threads = {t["name"]: t["frames"] for t in hang.evidence["threads"]}
    assert sorted(n for n, frames in threads.items() if frames[-1].endswith(wait)) == ["pair-0", "pair-1"]
    assert "dflashdoctor-sampler" not in threads
    assert hang.where.file.endswith("tests/targets/run/deadlock.py")


def test_a_run_dflashdoctor_was_stopped_in_has_no_verdict():
    overview, process = judged(CASES["run-interrupted"])
    (interrupted,) = found([overview], "run-interrupted")
    assert interrupted.evidence["command"][-1] == "import time; time.sleep(300)"
    assert overview.status == "error"  # exit 3, not 1
    assert check(overview, "interrupted").status == "fail"
    assert check(overview, "exit code").status == "info"
    assert not codes([process]) and "child-failed" not in codes([overview])  # the stop is not the child's fault


def test_out_of_memory_names_the_dense_kernel_whose_score_matrix_did_not_fit():
    overview, process = judged(CASES["oom"])
    (oom,) = found([process], "oom")
    assert oom.title.startswith("Out of memory in drafter.layers.0.self_attn: the dense flex_attention forward")
    assert "score matrix of 128 GiB per call" in oom.title
    assert (oom.where.module, oom.where.line) == ("drafter.layers.0.self_attn", 49)
    assert oom.where.file.endswith("dflashdoctor/reference/drafter.py")
    allocator, dense = oom.evidence["allocator"], oom.evidence["dense_events_before"]
    assert allocator["device"] == "cuda:0"
    assert allocator["requested_bytes"] == dense[-1]["score_matrix_bytes"]  # the allocation was the score matrix
    assert oom.evidence["call_in_flight"]["module"] == "drafter.layers.0.self_attn"
    assert "uncaught-exception" not in codes([process])  # the OOM error is reported once, as oom
    (dense_forward,) = found([process], "dense-forward")
    assert dense_forward.where.module == oom.where.module
    assert found([overview], "child-failed")[0].evidence["returncode"] == 1


def test_an_eager_flex_call_is_dense_forward_at_its_line():
    overview, process = judged(CASES["dense-forward"])
    (dense,) = found([process], "dense-forward")
    assert dense.where.file.endswith("tests/targets/run/eager_flex.py")
    assert dense.where.line == line_of("eager_flex.py", "FLEX_LINE")
    assert dense.evidence["q_shape"] == [1, 2, 128, 16] and dense.evidence["score_matrix_bytes"] == 2 * 128 * 128 * 4
    assert check(process, "flex calls").status == "fail" and process.status == "fail"
    assert check(overview, "exit code").status == "pass"  # the program itself exited 0


def test_a_command_that_never_loads_the_agent_says_so():
    (overview,) = judged(CASES["instrumentation-unavailable"])
    (unavailable,) = found([overview], "instrumentation-unavailable")
    assert unavailable.title == "No Python process of the command loaded dflashdoctor's agent"
    processes = check(overview, "processes")
    assert (processes.status, processes.summary) == ("warn", "0 Python processes started, 0 imported torch")
    assert overview.measurements["command"][:2] == ["sh", "-c"] and overview.status == "pass"


DAMAGED_RECORDS = [
    '{"pid": PID, "kind": "step", "t": 1.0, "step": "abc"}',
    '{"pid": PID, "kind": "step", "t": 1.0, "step": 3, "memory": 5}',
    '{"pid": PID, "kind": "step", "t": 1.0, "step": 3, "memory": {"cuda:0": {"peak_bytes": "lots"}}}',
    '{"pid": PID, "kind": "step", "t": "abc", "step": 3}',
    '{"pid": PID, "kind": "step", "t": 1e999, "step": 3}',
    '{"pid": PID, "kind": "step", "step": -1}',
    '{"pid": PID, "kind": "dense", "t": 1.0}',
    '{"pid": PID, "kind": "dense", "t": 1.0, "event": [1, 2]}',
    '{"pid": PID, "kind": "snapshot", "t": 1.0, "observations": 7}',
    '{"pid": PID, "kind": "start", "argv": "not a list"}',
    '{"pid": PID, "kind": "oom", "steps": {"a": 1}}',
    '{"pid": PID, "kind": "exit", "rank": "zero"}',
    '{"pid": "PID", "kind": "exit"}',
    '{"pid": true, "kind": "exit"}',
    "[1, 2, 3]",
    "17",
    '{"pid": 1' + "0" * 5000 + ', "kind": "exit"}',
    "[" * 100_000 + "]" * 100_000,
]


def test_a_damaged_or_hostile_event_record_is_a_counted_damaged_line():
    """Each of these once stopped the doctor (exit 3, no report) while the command ran on: now
    each is one damaged line, and the run is judged as it was without them."""
    import json
    import shutil
    import tempfile
    from pathlib import Path

    from dflashdoctor.registry import PROBES
    from dflashdoctor.runs.observations import RunObservations
    from tests.unit.recorded import ASSETS

    name = "cpu/run-eager-flex"
    data = json.loads((ASSETS / f"{name}.json").read_text())["probes"]["run"]
    clean = [str(f.code) for r in judged(name) for f in r.findings]
    with tempfile.TemporaryDirectory() as tmp:
        events = Path(tmp) / "events"
        shutil.copytree(ASSETS / f"{name}.events", events)
        (log,) = [p for p in events.glob("*.jsonl") if "-" in p.stem]
        pid = log.stem.rsplit("-", 1)[1]
        with log.open("a") as handle:
            handle.writelines(record.replace("PID", pid) + "\n" for record in DAMAGED_RECORDS)
        results = PROBES["run"].judge(RunObservations.read(data, events), Budgets())
    assert [str(f.code) for r in results for f in r.findings] == clean
    (process,) = [r for r in results if r.probe != "run"]
    assert process.measurements["damaged_event_lines"] == len(DAMAGED_RECORDS)
