"""`dflashdoctor run -- CMD` on real programs in real child processes: an eager flex_attention call,
a deadlock, torchrun with gloo and a fault on one rank, exit codes, child processes, exceptions
inside modules, --steps and --strict, and instrumentation that must never change the program."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import dflashdoctor
from dflashdoctor.agent.config import VERSION, RunSettings
from dflashdoctor.runs import launch
from tests.conftest import CliRun, permissions_apply, run_cli
from tests.paths import TARGETS

SCRIPTS = TARGETS / "run"


def _line(script: str, marker: str) -> int:
    lines = (SCRIPTS / script).read_text().splitlines()
    return next(i for i, text in enumerate(lines, 1) if f"# {marker}" in text)


def run(tmp_path: Path, *args: str, timeout: float = 300) -> CliRun:
    return run_cli(tmp_path, "run", *args, timeout=timeout)


def test_eager_flex_call_is_dense_forward_at_its_line(tmp_path):
    result = run(tmp_path, "--", "python", str(SCRIPTS / "eager_flex.py"))
    assert result.code == 1, result.stdout + result.stderr
    assert "eager flex done (1, 2, 128, 16)" in result.stdout  # the program's own output passes through
    (dense,) = result.findings("dense-forward")
    assert dense["where"]["file"] == str(SCRIPTS / "eager_flex.py")
    assert dense["where"]["line"] == _line("eager_flex.py", "FLEX_LINE")
    assert dense["evidence"]["pid"] > 0 and dense["evidence"]["rank"] is None
    overview = result.report["results"][0]
    assert overview["measurements"]["returncode"] == 0 and overview["measurements"]["instrumented"] == 1


@pytest.mark.parametrize("tool", ["py-spy", "faulthandler"])
def test_deadlock_is_reported_as_a_hang_with_both_threads_stacks(tmp_path, tool):
    if tool == "py-spy" and shutil.which("py-spy") is None:
        pytest.skip("py-spy is not installed")
    env = {"PATH": "/usr/bin:/bin"} if tool == "faulthandler" else None  # a PATH without py-spy
    args = ("--hang-timeout", "4", "--", sys.executable, str(SCRIPTS / "deadlock.py"))
    result = run_cli(tmp_path, "run", *args, timeout=300, env=env)
    assert result.code == 1, result.stdout + result.stderr
    (hang,) = result.findings("hang")
    assert hang["evidence"]["tool"] == tool
    threads = {t["name"]: t["frames"] for t in hang["evidence"]["threads"]}
    wait = f"{SCRIPTS / 'deadlock.py'}:{_line('deadlock.py', 'WAIT_LINE')} in take"
    stuck = [name for name, frames in threads.items() if wait in frames]
    assert len(stuck) == 2, threads  # both threads, each waiting for the other's lock
    assert result.check("watchdog")["status"] == "fail"
    assert result.report["results"][0]["measurements"]["returncode"] != 0  # stopped by the doctor


@pytest.mark.skipif(shutil.which("torchrun") is None, reason="needs torchrun")
def test_torchrun_gives_a_section_per_rank_and_finds_the_fault_on_rank_1(tmp_path):
    script = str(SCRIPTS / "ddp_fault_on_one_rank.py")
    result = run(tmp_path, "--hang-timeout", "120", "--", "torchrun", "--standalone", "--nproc-per-node", "2", script)
    assert result.code == 1, result.stdout + result.stderr
    sections = {r["probe"].split(" (")[0]: r for r in result.report["results"][1:]}
    assert {"rank 0", "rank 1"} <= set(sections)
    assert sections["rank 0"]["status"] == "pass" and sections["rank 1"]["status"] == "fail"
    (dense,) = result.findings("dense-forward")
    assert dense["evidence"]["rank"] == 1
    assert (dense["where"]["file"], dense["where"]["line"]) == (script, _line("ddp_fault_on_one_rank.py", "FLEX_LINE"))
    assert sections["rank 0"]["measurements"]["steps"] == 3 == sections["rank 1"]["measurements"]["steps"]


def test_exit_code_of_the_command_is_kept(tmp_path):
    result = run(tmp_path, "--", "python", str(SCRIPTS / "exits_3.py"))
    assert result.code == 1
    (failed,) = result.findings("child-failed")
    assert failed["evidence"]["returncode"] == 3
    assert result.report["results"][0]["measurements"]["returncode"] == 3


def test_child_python_processes_are_instrumented_too(tmp_path):
    result = run(tmp_path, "--", "python", str(SCRIPTS / "spawns_child.py"))
    assert result.code == 1, result.stdout + result.stderr
    processes = result.report["results"][0]["measurements"]["processes"]
    assert len(processes) == 2
    child = next(p for p in processes if p["argv"][-1].endswith("eager_flex.py"))
    (dense,) = result.findings("dense-forward")
    assert dense["evidence"]["pid"] == child["pid"]


def test_uncaught_exception_names_the_module_it_came_from(tmp_path):
    result = run(tmp_path, "--", "python", str(SCRIPTS / "raises_in_module.py"))
    (raised,) = result.findings("uncaught-exception")
    assert raised["evidence"]["module"] == "blocks.1"
    assert raised["where"]["line"] == _line("raises_in_module.py", "RAISE_LINE")
    assert result.findings("child-failed")[0]["evidence"]["returncode"] == 1


def test_a_compiled_call_while_another_thread_traces_names_the_fx_flag(tmp_path):
    result = run(tmp_path, "--", "python", str(SCRIPTS / "fx_flag_threads.py"))
    (raised,) = result.findings("uncaught-exception")
    assert raised["evidence"]["known_cause"] == "fx-tracing-flag"
    assert "process-global flag" in raised["detail"] and "one thread" in raised["fix"]
    assert raised["where"]["line"] == _line("fx_flag_threads.py", "CALL_LINE")


def test_steps_stops_each_process_after_that_many_optimizer_steps(tmp_path):
    result = run(tmp_path, "--steps", "3", "--", "python", str(SCRIPTS / "trains_forever.py"))
    assert result.code == 0, result.stdout + result.stderr
    section = result.report["results"][1]["measurements"]
    assert section["steps"] == 3 and section["ending"] == "steps-limit"


def test_strict_makes_a_dense_flex_kernel_raise(tmp_path):
    result = run(tmp_path, "--strict", "--", "python", str(SCRIPTS / "eager_flex.py"))
    assert "eager flex done" not in result.stdout
    (raised,) = result.findings("uncaught-exception")
    assert raised["evidence"]["type"] == "StrictModeError"
    assert result.findings("child-failed")
    # The call that raised is still counted, its dense kernel charged to its line (an OOM is the same).
    (dense,) = result.findings("dense-forward")
    assert dense["where"]["line"] == _line("eager_flex.py", "FLEX_LINE") and "(1 of 1 calls)" in dense["title"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((), "dflashdoctor: put the command after --, e.g. dflashdoctor run -- python train.py"),
        (("python", "-c", "pass"), "dflashdoctor: put the command after --, e.g. dflashdoctor run -- python train.py"),
        (("--",), "dflashdoctor: nothing to run: put the command after --, e.g. dflashdoctor run -- python train.py"),
        (("--", "no-such-program-here"), "dflashdoctor: command not found: no-such-program-here"),
        (
            ("--steps", "0", "--", "python", "-c", "pass"),
            "dflashdoctor: --steps must be a whole number from 1 to 1000000, not 0",
        ),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, args, message):
    result = run(tmp_path, *args)
    assert result.code == 2
    assert result.stderr.strip() == message


def _plain_and_instrumented(tmp_path: Path, script: str, events: Path, prefix: tuple[str, ...] = ()):
    """The program run alone, then with the agent loaded as `run` loads it."""
    command = [*prefix, sys.executable, str(SCRIPTS / script)]
    plain = subprocess.run(command, capture_output=True, text=True, timeout=120)
    bootstrap = launch.bootstrap_folder()
    try:
        env = launch.child_environment(bootstrap, events, RunSettings())
        instrumented = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)
    finally:
        shutil.rmtree(bootstrap)
    return plain, instrumented


def test_a_program_with_its_own_excepthook_behaves_as_it_does_alone(tmp_path):
    events = tmp_path / "events"
    events.mkdir()
    plain, instrumented = _plain_and_instrumented(tmp_path, "own_hooks.py", events)
    expected = (5, "hello from own_hooks\nown hook saw KeyError\n")
    assert (instrumented.returncode, instrumented.stdout) == (plain.returncode, plain.stdout) == expected
    kinds = [line.split('"kind": "')[1].split('"')[0] for line in next(events.glob("*.jsonl")).read_text().splitlines()]
    assert kinds[0] == "start" and kinds[-1] == "exit"  # the agent was there, and its hook made way for the program's


def test_an_agent_that_cannot_write_its_events_leaves_the_program_alone(tmp_path):
    prefix = permissions_apply(tmp_path)
    events = tmp_path / "events"
    events.mkdir(mode=0o555)
    plain, instrumented = _plain_and_instrumented(tmp_path, "exits_3.py", events, prefix)
    expected = (3, "about to exit 3\n")
    assert (instrumented.returncode, instrumented.stdout) == (plain.returncode, plain.stdout) == expected
    assert "dflashdoctor: instrumentation not started" in instrumented.stderr


def test_a_sitecustomize_the_bootstrap_shadows_still_runs(tmp_path):
    own = tmp_path / "own-site"
    own.mkdir()
    (own / "sitecustomize.py").write_text("import os\nos.environ['OWN_SITECUSTOMIZE'] = 'ran'\n")
    events = tmp_path / "events"
    events.mkdir()
    bootstrap = launch.bootstrap_folder()
    try:
        env = launch.child_environment(bootstrap, events, RunSettings())
        env["PYTHONPATH"] += os.pathsep + str(own)
        code = "import os, sys; print(os.environ.get('OWN_SITECUSTOMIZE'), 'dflashdoctor.agent.process' in sys.modules)"
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    finally:
        shutil.rmtree(bootstrap)
    assert done.stdout.split() == ["ran", "True"], done.stderr


def test_the_doctors_own_copy_is_imported_by_its_real_path(tmp_path):
    """A program whose environment has another dflashdoctor (here: one the bootstrap is told is of
    another version) gets the doctor's copy, named by the files' real paths, not by the temporary
    link, which is gone once the run ends (a report naming the reference trainer's lines)."""
    events = tmp_path / "events"
    events.mkdir()
    bootstrap = launch.bootstrap_folder()
    try:
        env = launch.child_environment(bootstrap, events, RunSettings())
        env[VERSION] = "0.0.0-another"
        code = (
            "import sys, dflashdoctor.reference, dflashdoctor.agent.process as agent; "
            "print(dflashdoctor.reference.__file__); print(agent.__file__); "
            "print(sum(p.startswith(sys.argv[1]) for p in sys.path))"
        )
        done = subprocess.run(
            [sys.executable, "-c", code, str(bootstrap)], capture_output=True, text=True, env=env, timeout=60
        )
    finally:
        shutil.rmtree(bootstrap)
    real = Path(dflashdoctor.__file__).resolve().parent
    assert done.stdout.split("\n")[:3] == [
        str(real / "reference" / "__init__.py"),
        str(real / "agent" / "process.py"),
        "1",  # the bootstrap's folder is on the path, its link to the package is not
    ], done.stderr
    (log,) = events.glob("*.jsonl")  # and the agent ran in it
    assert json.loads(log.read_text().splitlines()[0])["kind"] == "start"


@pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="needs transformers")
@pytest.mark.parametrize(
    ("fault", "code", "expected"),
    [("none", 0, None), ("eager-wrapper", 1, "dense-forward"), ("hf-flex-path", 0, "hf-internal-flex-path")],
)
def test_reference_trainer_faults_on_the_cpu(tmp_path, fault, code, expected):
    """The trainer's pairs share one process: one section, its drafter layers named (forward only here:
    flex_attention has no CPU backward)."""
    trainer = ("--", sys.executable, "-m", "dflashdoctor.reference.trainer", "--steps", "2", "--fault", fault)
    result = run(tmp_path, "--hang-timeout", "240", *trainer)
    assert result.code == code, result.stdout[-3000:] + result.stderr[-3000:]
    (section,) = [r for r in result.report["results"][1:] if r["measurements"]["steps"]]
    assert section["measurements"]["steps"] == 2
    if expected is None:
        assert not result.findings()
        return
    found = result.findings(expected)
    assert found and all(f["where"]["module"].startswith("drafter.layers.") for f in found)


def _two_node_run(
    shared: Path, node_rank: int, port: int, *extra: str, per_node: int = 2, env: dict[str, str] | None = None
) -> subprocess.Popen[str]:
    """One node's `dflashdoctor run` of a two-node torchrun (static rendezvous on loopback); gloo
    unless `env` says DDP_BACKEND=nccl. Rank 3 (or FAULT_RANK) calls flex_attention raw."""
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", str(node_rank)]
    torchrun += ["--nproc-per-node", str(per_node), "--master-addr", "127.0.0.1", "--master-port", str(port)]
    command = [sys.executable, "-m", "dflashdoctor", "run", "--report-dir", str(shared), *extra]
    command += ["--", *torchrun, str(SCRIPTS / "ddp_fault_on_one_rank.py")]
    environment = {**os.environ, "FAULT_RANK": "3", **(env or {})}
    return subprocess.Popen(
        command, cwd=shared.parent, env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def _merge(folder: Path) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "dflashdoctor", "merge", str(folder), "--json"]
    return subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)


def test_two_nodes_merge_into_one_report_by_rank(tmp_path):
    """Two `dflashdoctor run` processes act as two nodes of a torchrun job (--nnodes 2, node ranks 0
    and 1, two workers each), rank 3 calling flex_attention raw: each writes its part under the shared
    folder, node 0 merges them, and the merged report holds four ranks over two nodes with the dense
    finding on rank 3 alone. `merge` run again gives the same."""
    from tests.integration.sshd import free_port

    shared = tmp_path / "shared"
    port = free_port()
    nodes = [_two_node_run(shared, rank, port, "--merge-wait", "120", "--hang-timeout", "120") for rank in (0, 1)]
    outputs = [node.communicate(timeout=600) for node in nodes]
    codes = [node.returncode for node in nodes]
    assert codes == [1, 1], outputs  # node 0: the merged verdict (rank 3's dense call); node 1: its own
    assert "2 of 2 nodes merged, FAIL" in outputs[0][1]
    parts = sorted(p.name for p in shared.iterdir() if p.is_dir())
    assert [p.split("-")[0] for p in parts] == ["node0", "node1"]
    merged = json.loads((shared / "report.json").read_text())
    assert merged["command"] == "merge"
    overview = merged["results"][0]
    (ranks,) = [t for t in overview["tables"] if t["title"] == "ranks"]
    assert sorted((row[0], row[2], row[3]) for row in ranks["rows"]) == [
        ("0", "0", "0"),
        ("0", "1", "1"),
        ("1", "2", "0"),
        ("1", "3", "1"),
    ]
    assert {row[4] for row in ranks["rows"]} == {"4"}  # the world size torch.distributed saw
    sections = {r["probe"]: r for r in merged["results"]}
    assert {"node 0: rank 0 (local rank 0)", "node 1: rank 3 (local rank 1)"} <= set(sections)
    dense = [
        (r["probe"], f["evidence"]["rank"])
        for r in merged["results"]
        for f in r["findings"]
        if f["code"] == "dense-forward"
    ]
    assert dense == [("node 1: rank 3 (local rank 1)", 3)]
    assert sections["node 1: rank 3 (local rank 1)"]["status"] == "fail"
    assert sections["node 0: rank 1 (local rank 1)"]["status"] == "pass"

    again = _merge(shared)
    assert again.returncode == 1, again.stderr
    document = json.loads(again.stdout)
    assert [r["probe"] for r in document["results"]] == [r["probe"] for r in merged["results"]]


def test_a_node_that_never_reports_is_a_finding_and_merge_needs_a_folder(tmp_path):
    """Node 0 alone (its peer never starts): torchrun waits in its rendezvous until the watchdog stops
    it, node 0 waits for its peer's part, then merges what is there, naming the missing node and where
    the launcher hung. `merge` of a folder with no parts is bad input."""
    from tests.integration.sshd import free_port

    shared = tmp_path / "shared"
    node = _two_node_run(shared, 0, free_port(), "--merge-wait", "1", "--hang-timeout", "10")
    node.communicate(timeout=600)
    assert node.returncode == 1
    merged = json.loads((shared / "report.json").read_text())
    (missing,) = [f for f in merged["results"][0]["findings"] if f["code"] == "node-missing"]
    assert missing["evidence"]["absent"] == 1
    hangs = [f for r in merged["results"] for f in r["findings"] if f["code"] == "hang"]
    assert hangs and "rendezvous" in hangs[0]["where"]["file"]
    (tmp_path / "empty").mkdir()
    empty = _merge(tmp_path / "empty")
    assert empty.returncode == 2 and "holds no node's part" in empty.stderr
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "train.py"]
    unshared = subprocess.run(
        [sys.executable, "-m", "dflashdoctor", "run", "--", *torchrun], cwd=tmp_path, capture_output=True, text=True
    )
    assert unshared.returncode == 2
    assert unshared.stderr.strip() == (
        "dflashdoctor: a run on 2 nodes needs --report-dir: a folder every node shares, where each writes its part"
    )


def test_steps_are_coalesced_after_the_first_hundred_and_none_is_lost(tmp_path):
    """500 steps: the first 100 are each a record, the rest share records (one per 5 s at most), the
    last record names step 500, and the report counts 500 steps."""
    result = run(tmp_path, "--steps", "500", "--", sys.executable, str(SCRIPTS / "trains_forever.py"))
    assert result.code == 0, result.stdout + result.stderr
    (events,) = [p for p in (result.report_dir / "events").iterdir() if p.suffix == ".jsonl"]
    steps = [json.loads(line) for line in events.read_text().splitlines() if '"kind": "step"' in line]
    assert [s["step"] for s in steps[:100]] == list(range(1, 101)) and all(s["covers"] == 1 for s in steps[:100])
    assert steps[-1]["step"] == 500 and sum(s["covers"] for s in steps) == 500
    assert len(steps) <= 100 + 1 + int(result.report["duration_s"] / 5) + 1
    (section,) = [r for r in result.report["results"][1:] if r["probe"].startswith("process")]
    assert section["measurements"]["steps"] == 500
    assert steps[-1]["step_s"]["min"] <= steps[-1]["step_s"]["mean"] <= steps[-1]["step_s"]["max"]


def test_two_runs_started_at_once_into_one_report_dir_never_mix(tmp_path):
    """Both may find the events folder empty; before, both then ran (exit 0 twice, seen in
    scripts/hostile_pass_2.py) and one report held both commands' processes. Now the first to claim
    the folder runs, the other is bad input (exit 2, one line)."""
    folder = tmp_path / "shared"
    program = "import os, time; time.sleep(2); print(os.getpid())"
    argv = [sys.executable, "-m", "dflashdoctor", "run", "--report-dir", str(folder), "--"]
    runs = [
        subprocess.Popen(
            [*argv, sys.executable, "-c", program],
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    done = [(proc, *proc.communicate(timeout=300)) for proc in runs]
    assert sorted(proc.returncode for proc, _, _ in done) == [0, 2], [err[-500:] for _, _, err in done]
    (refused,) = [err for proc, _, err in done if proc.returncode == 2]
    assert len(refused.strip().splitlines()) == 1  # which line depends on which got there first
    assert "belongs to another run" in refused or "holds events of an earlier run" in refused
    report = json.loads((folder / "report.json").read_text())
    processes = [r for r in report["results"][1:] if r["measurements"].get("pid")]
    assert len(processes) <= 1 and report["results"][0]["measurements"]["returncode"] == 0
