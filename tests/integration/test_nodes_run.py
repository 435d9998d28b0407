"""The gate's `run` on every node of a cluster: three sshd on loopback ports act as three nodes, each
running the team's trainer on its own (the multi-node torchrun command in its single-node form). What
differs is each node's environment, as on a real cluster: node-b has TORCHDYNAMO_DISABLE=1 set, so its
compiled wrapper runs flex_attention dense; node-c's steps are slowed (TRAIN_STEP_SLEEP, standing for a
node whose GPUs other jobs share). The nodes section names each odd node, the site and the times; the
ground truth is each node's own run section (dense kernels recorded at the site, steps timed)."""

from __future__ import annotations

import json
import sys

import pytest

from tests.conftest import run_cli
from tests.integration.sshd import HAVE_SSH, client_key, ssh_config, start_sshd
from tests.paths import TARGETS

pytestmark = pytest.mark.skipif(not HAVE_SSH, reason="needs sshd and ssh")

TRAINER = TARGETS / "gate" / "node_trainer.py"
_ENVIRONMENTS = {"node-a": {}, "node-b": {"TORCHDYNAMO_DISABLE": "1"}, "node-c": {"TRAIN_STEP_SLEEP": "0.6"}}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    home = tmp_path_factory.mktemp("run-cluster")
    key = client_key(home)
    servers = {name: start_sshd(home / f"{name}-sshd", key, env) for name, env in _ENVIRONMENTS.items()}
    yield f"-F {ssh_config(home, key, {name: server.port for name, server in servers.items()})}"
    for server in servers.values():
        server.stop()


def _flex_line() -> int:
    return next(i for i, text in enumerate(TRAINER.read_text().splitlines(), 1) if "FLEX_LINE" in text)


def test_each_node_runs_the_trainer_alone_and_the_odd_nodes_are_named(tmp_path, cluster):
    command = (
        f"{sys.executable} -m torch.distributed.run --nnodes 3 --node-rank 0 --master-addr 10.0.0.1 "
        f"--master-port 29400 --nproc-per-node 1 {TRAINER}"
    )
    (tmp_path / "dflashdoctor.toml").write_text(
        f'probes = ["env"]\nrun = "{command}"\nrun_steps = 4\nrun_timeout = 300\n'
    )
    (tmp_path / "hostfile").write_text("node-a\nnode-b\nnode-c\n")
    done = run_cli(
        tmp_path,
        "gate",
        "--hostfile",
        "hostfile",
        "--python",
        sys.executable,
        "--json",
        env={"DFLASHDOCTOR_SSH_OPTIONS": cluster},
        timeout=600,
    )
    assert done.code == 1, done.stdout[-3000:] + done.stderr[-3000:]
    results = {r["probe"]: r for r in done.report["results"]}
    nodes = results["nodes"]

    # ground truth, each node's own run: node-b's process recorded dense kernels at the line, the others none
    def process(node: str) -> dict:
        (section,) = [r for name, r in results.items() if name.startswith(f"{node}: rank 0")]
        return section

    assert [process(n)["measurements"]["dense_kernels"] > 0 for n in _ENVIRONMENTS] == [False, True, False]
    assert all(process(n)["measurements"]["steps"] >= 4 for n in _ENVIRONMENTS)  # no node waited for the others
    assert all(results[f"{n}: run"]["measurements"]["returncode"] is not None for n in _ENVIRONMENTS)
    observations = json.loads((done.report_dir / "observations.json").read_text())["probes"]
    assert observations["node-b"]["run"]["command"][:3] == [sys.executable, "-m", "torch.distributed.run"]
    assert "--standalone" in observations["node-b"]["run"]["command"]  # the single-node form ran there

    site = f"{TRAINER}:{_flex_line()}"
    (dense,) = [f for f in nodes["findings"] if f["code"] == "node-mismatch" and f["evidence"].get("site")]
    assert dense["evidence"] == {"site": site, "dense_on": ["node-b"], "fused_on": ["node-a", "node-c"]}
    (slow,) = [f for f in nodes["findings"] if f["code"] == "node-slow-steps"]
    assert slow["evidence"]["node"] == "node-c" and slow["evidence"]["ratio"] > 1.5
    assert slow["evidence"]["step_seconds"] >= 0.6  # the planted pause, once per step
    hazards = [f for f in nodes["findings"] if f["evidence"].get("fact") == "hazards set"]
    assert hazards and hazards[0]["evidence"]["odd_nodes"] == ["node-b"]  # env saw the cause there too

    (table,) = [t for t in nodes["tables"] if t["title"] == "run across nodes"]
    rows = {row[0]: row for row in table["rows"]}
    assert rows["node-a"][4] == "none" and rows["node-b"][4] == site and rows["node-b"][1] == "FAIL"
    checks = {c["name"]: c for c in nodes["checks"]}
    assert checks["run"]["status"] == "fail" and "node-c 1." not in checks["run"]["summary"]
    assert f"{site} dense on node-b only" in checks["run"]["summary"] and "node-c" in checks["run"]["summary"]


def test_a_node_without_the_gates_folder_says_so_as_bad_input(tmp_path):
    """The probe a node runs for `run` (probes/run_smoke.py, a real child process as ssh starts it
    there): the gate's folder missing on that node is a usage error naming it, never a traceback."""
    import json
    import subprocess

    from dflashdoctor.budgets import Budgets
    from dflashdoctor.probe_configs import RunSmokeConfig, to_json
    from dflashdoctor.runner import probes_dir

    missing = tmp_path / "not-on-this-node"
    config = RunSmokeConfig([sys.executable, str(TRAINER)], 1, 60, Budgets(), str(missing), ["dflashdoctor", "gate"])
    (tmp_path / "config.json").write_text(to_json(config))
    out = tmp_path / "result.json"
    done = subprocess.run(
        [
            sys.executable,
            str(probes_dir() / "run_smoke.py"),
            "--config",
            str(tmp_path / "config.json"),
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    payload = json.loads(out.read_text())
    assert set(payload) == {"usage_error"}
    assert str(missing) in payload["usage_error"] and "gate from a folder the nodes share" in payload["usage_error"]
