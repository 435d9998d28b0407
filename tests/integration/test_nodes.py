"""The gate across nodes: three sshd on loopback ports act as three nodes of a cluster (named in an ssh
config, as a cluster names its nodes), each with caches of its own; one node runs another Python
environment (the hostfile's python=), one has a corrupted Triton cache, and a fourth host is not
there at all. The merged report names exactly the two odd nodes and what differs. A bad hostfile is
refused before any node is reached: those run the gate in this process (run_cli_here)."""

from __future__ import annotations

import sys

import pytest

from tests.cache_tree import healthy_tree, truncate_binary
from tests.conftest import run_cli, run_cli_here
from tests.integration.sshd import HAVE_SSH, client_key, free_port, ssh_config, start_sshd

pytestmark = pytest.mark.skipif(not HAVE_SSH, reason="needs sshd and ssh")

_PROBES = 'probes = ["env", "cache"]\n'


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """node-a, node-b, node-c on loopback ports, each session's caches under its own folder (node-c's
    Triton cache truncated); node-d resolves to a closed port. Yields (ssh options, caches)."""
    home = tmp_path_factory.mktemp("cluster")
    key = client_key(home)
    servers, ports, caches = [], {}, {}
    for name in ("node-a", "node-b", "node-c"):
        triton, inductor = home / name / "triton", home / name / "inductor"
        kernels = healthy_tree(triton, 2)
        inductor.mkdir(parents=True)
        if name == "node-c":
            truncate_binary(kernels[1])
        caches[name] = {"triton": str(triton), "inductor": str(inductor)}
        server = start_sshd(
            home / f"{name}-sshd", key, {"TRITON_CACHE_DIR": str(triton), "TORCHINDUCTOR_CACHE_DIR": str(inductor)}
        )
        servers.append(server)
        ports[name] = server.port
    ports["node-d"] = free_port()  # nothing listens there
    config = ssh_config(home, key, ports)
    yield f"-F {config}", caches
    for server in servers:
        server.stop()


def test_the_merged_report_names_the_odd_nodes_and_what_differs(tmp_path, cluster, venv_without_triton):
    options, caches = cluster
    (tmp_path / "dflashdoctor.toml").write_text(_PROBES)
    (tmp_path / "hostfile").write_text(
        "# the cluster\nnode-a slots=1\n"
        f"node-b slots=1 python={venv_without_triton}   # another environment: torch without triton\n"
        "node-c slots=1\nnode-d slots=1\n"
    )
    env = {"DFLASHDOCTOR_SSH_OPTIONS": options}
    run = run_cli(tmp_path, "gate", "--hostfile", "hostfile", "--python", sys.executable, env=env)
    assert run.code == 1, run.stdout[-3000:] + run.stderr[-2000:]
    report = run.report
    nodes = report["results"][0]
    assert nodes["probe"] == "nodes"
    probes = [r["probe"] for r in report["results"][1:]]
    for name in ("node-a", "node-b", "node-c"):
        assert f"{name}: env" in probes and f"{name}: cache" in probes
    assert not [p for p in probes if p.startswith("node-d")]
    for name in ("node-a", "node-b", "node-c"):  # each node's own sessions, its own caches
        env_section = next(r for r in report["results"] if r["probe"] == f"{name}: env")
        assert {r["kind"]: r["path"] for r in env_section["measurements"]["cache_roots"]} == caches[name]

    (unreachable,) = [f for f in nodes["findings"] if f["code"] == "node-unreachable"]
    assert unreachable["evidence"]["node"] == "node-d" and "refused" in unreachable["evidence"]["error"]

    mismatches = [f for f in nodes["findings"] if f["code"] == "node-mismatch"]
    odd = {node for f in mismatches for node in f["evidence"]["odd_nodes"]}
    assert odd == {"node-b", "node-c"}, [f["title"] for f in mismatches]
    by_subject = {f["evidence"].get("fact") or f["evidence"].get("check"): f for f in mismatches}
    assert by_subject["triton"]["evidence"]["odd_nodes"] == ["node-b"]
    assert by_subject["triton"]["title"].startswith("triton differs on node-b: not installed on node-b")
    assert by_subject["check `cache: triton`"]["evidence"]["odd_nodes"] == ["node-c"]
    assert by_subject["check `cache: triton`"]["evidence"]["values"] == {
        "node-a": "pass",
        "node-b": "pass",
        "node-c": "fail",
    }
    checks = {c["name"]: c["status"] for c in nodes["checks"]}
    assert checks["node-a"] == "pass" and checks["node-c"] == "fail" and checks["node-d"] == "fail"
    tables = {t["title"]: t for t in nodes["tables"]}
    assert tables["checks across nodes"]["columns"] == ["check", "node-a", "node-b", "node-c"]
    assert ["cache: triton", "PASS", "PASS", "FAIL"] in tables["checks across nodes"]["rows"]

    # progress: one line per node on stderr as each finishes
    progress = [line for line in run.stderr.splitlines() if line.startswith("dflashdoctor gate: node-")]
    assert len(progress) == 4 and any("node-d: unreachable" in line for line in progress)
    assert run.stdout.count("nodes") >= 1


def test_repeated_ssh_and_a_hostfile_on_stdin(tmp_path, cluster):
    """--ssh twice gates both; a hostfile on stdin reads the same; --json keeps stdout one document."""
    import json
    import subprocess

    options, _caches = cluster
    (tmp_path / "dflashdoctor.toml").write_text('probes = ["cache"]\n')
    env = {"DFLASHDOCTOR_SSH_OPTIONS": options}
    run = run_cli(tmp_path, "gate", "--ssh", "node-a", "--ssh", "node-c", "--python", sys.executable, env=env)
    assert run.code == 1
    names = [r["probe"] for r in run.report["results"]]
    assert names == ["nodes", "node-a: cache", "node-c: cache"]
    done = subprocess.run(
        [sys.executable, "-m", "dflashdoctor", "gate", "--hostfile", "-", "--python", sys.executable, "--json"],
        input="node-a\nnode-b\n",
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**__import__("os").environ, **env},
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    document = json.loads(done.stdout)
    assert [r["probe"] for r in document["results"]] == ["nodes", "node-a: cache", "node-b: cache"]


@pytest.mark.parametrize(
    ("hostfile", "message"),
    [
        ("", "hostfile names no node"),
        ("node-a slots=0\n", "hostfile:1: slots must be a whole number from 1 to 4096, not 0"),
        ("node-a\nnode-a\n", "hostfile:2: node-a is listed already, at line 1"),
        ("node-a gpus=8\n", "hostfile:1: 'gpus=8' is not slots=N, max_slots=N or python=PATH"),
        ("-oProxyCommand=x\n", "hostfile:1: '-oProxyCommand=x': expected [user@]host[:port]"),
    ],
)
def test_a_bad_hostfile_is_one_line_and_exit_2(tmp_path, hostfile, message):
    (tmp_path / "hostfile").write_text(hostfile)
    run = run_cli_here(tmp_path, "gate", "--hostfile", "hostfile")
    assert run.code == 2 and run.stderr.strip() == f"dflashdoctor: {message}", run.stderr
