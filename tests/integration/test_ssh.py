"""`--ssh` against a real sshd the test starts on loopback: the probed side runs over ssh with the
probe code shipped along, arguments cannot inject shell code, and failures are one line. The same
sshd serves an sshfs mount: a real network filesystem under a cache root."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys

import pytest

from tests.conftest import run_cli
from tests.integration.sshd import HAVE_SSH, client_key, client_options, free_port, start_sshd, user

pytestmark = pytest.mark.skipif(not HAVE_SSH, reason="needs sshd and ssh")


@pytest.fixture(scope="module")
def sshd(tmp_path_factory):
    """A key-only sshd on 127.0.0.1 for the current user; yields (destination, ssh options)."""
    home = tmp_path_factory.mktemp("sshd")
    key = client_key(home)
    server = start_sshd(home, key)
    yield f"{user()}@127.0.0.1:{server.port}", client_options(home, key)
    server.stop()


@pytest.fixture
def sshfs_folder(tmp_path, sshd):
    """A folder mounted over sshfs from the test's sshd (filesystem type fuse.sshfs), unmounted after."""
    fusermount = shutil.which("fusermount3") or shutil.which("fusermount")
    if shutil.which("sshfs") is None or fusermount is None or not os.path.exists("/dev/fuse"):
        pytest.skip("needs sshfs and /dev/fuse")
    destination, options = sshd
    host, port = destination.rsplit(":", 1)
    served, mounted = tmp_path / "served", tmp_path / "mounted"
    served.mkdir()
    mounted.mkdir()
    ssh_command = shlex.join(["ssh", *shlex.split(options)])
    done = subprocess.run(
        ["sshfs", "-p", port, "-o", f"ssh_command={ssh_command}", f"{host}:{served}", str(mounted)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if done.returncode != 0:
        pytest.skip(f"sshfs could not mount: {done.stderr.strip()[-300:]}")
    yield mounted
    subprocess.run([fusermount, "-u", "-z", str(mounted)], capture_output=True, timeout=60)


def _env(options: str, **extra: str) -> dict[str, str]:
    return {"DFLASHDOCTOR_SSH_OPTIONS": options, **extra}


def test_env_runs_on_the_other_side(tmp_path, sshd):
    destination, options = sshd
    # A variable set only here: the remote side (a fresh ssh session) must not see it.
    run = run_cli(
        tmp_path, "env", "--ssh", destination, "--python", sys.executable, env=_env(options, TORCH_ONLY_HERE="1")
    )
    assert run.code == 0, run.stdout[-3000:] + run.stderr[-2000:]
    (result,) = run.report["results"]
    assert result["measurements"]["executable"] == sys.executable
    assert "TORCH_ONLY_HERE" not in result["measurements"]["variables"]
    assert run.report["environment"]["probed_host"] == destination
    (tmp_path / "local").mkdir()
    local = run_cli(tmp_path / "local", "env", env={"TORCH_ONLY_HERE": "1"})
    assert local.report["results"][0]["measurements"]["variables"]["TORCH_ONLY_HERE"] == "1"


def test_arguments_cannot_inject_shell_code(tmp_path, sshd):
    destination, options = sshd
    witness = tmp_path / "injected"
    hostile_python = f"python3; touch {witness}"
    run = run_cli(tmp_path, "env", "--ssh", destination, "--python", hostile_python, env=_env(options))
    assert run.code == 2  # no such interpreter there (the whole string is one program name)
    hostile_target = f"x$(touch {witness}):attr"
    run = run_cli(
        tmp_path, "check-compile", hostile_target, "--ssh", destination, "--python", sys.executable, env=_env(options)
    )
    assert run.code == 2
    assert not witness.exists()


def test_a_python_missing_there_is_one_line_naming_it(tmp_path, sshd):
    destination, options = sshd
    run = run_cli(tmp_path, "env", "--ssh", destination, "--python", "/no/such/python3", env=_env(options))
    assert run.code == 2
    host = destination.split("@")[1].split(":")[0]
    assert run.stderr.strip() == (
        f"dflashdoctor: --ssh {host}: no `/no/such/python3` there (exit 127): give --python its path on that machine"
    )


def test_gate_over_ssh_checks_that_machines_caches_there(tmp_path, sshd):
    """The cache check runs on the other side too: its roots, as its environment names them."""
    destination, options = sshd
    (tmp_path / "dflashdoctor.toml").write_text('probes = ["env", "check-compile", "cache"]\n')
    run = run_cli(tmp_path, "gate", "--ssh", destination, "--python", sys.executable, env=_env(options))
    assert run.code == 0, run.stdout[-3000:] + run.stderr[-2000:]
    statuses = {r["probe"]: r["status"] for r in run.report["results"]}
    assert statuses == {"env": "pass", "check-compile": "pass", "cache": "pass"}


def test_cache_check_over_ssh_scans_there_and_fix_stays_here(tmp_path, sshd):
    """A root that exists only in the remote session's environment is scanned there and found
    broken; fix and restore refuse --ssh (the option is not theirs)."""
    from tests.cache_tree import healthy_tree, truncate_binary

    destination, options = sshd
    root = tmp_path / "remote-triton"
    truncate_binary(healthy_tree(root, 2)[1])
    run = run_cli(
        tmp_path,
        "cache",
        "check",
        "--triton-dir",
        str(root),
        "--ssh",
        destination,
        "--python",
        sys.executable,
        env=_env(options),
    )
    assert run.code == 1, run.stdout[-3000:] + run.stderr[-2000:]
    assert run.report["environment"]["probed_host"] == destination
    assert [f["code"] for f in run.findings() if f["severity"] == "error"] == ["cache-corrupt-entry"]
    missing = run_cli(
        tmp_path,
        "cache",
        "check",
        "--triton-dir",
        str(tmp_path / "nothing"),
        "--ssh",
        destination,
        "--python",
        sys.executable,
        env=_env(options),
    )
    assert missing.code == 2 and missing.stderr.strip().endswith("does not exist")
    refused = run_cli(tmp_path, "cache", "fix", "--ssh", destination, env=_env(options))
    assert refused.code == 2 and "--ssh" in refused.stderr


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("-oProxyCommand=touch", "dflashdoctor: --ssh '-oProxyCommand=touch': expected [user@]host[:port]"),
        ("host:99999", "dflashdoctor: --ssh 'host:99999': port 99999 is out of range"),
    ],
)
def test_bad_ssh_spec_is_one_line_and_exit_2(tmp_path, spec, message):
    run = run_cli(tmp_path, "env", "--ssh", spec)
    assert run.code == 2 and run.stderr.strip() == message


def test_unreachable_host_is_one_line_and_exit_2(tmp_path, sshd):
    _, options = sshd
    run = run_cli(tmp_path, "env", "--ssh", f"127.0.0.1:{free_port()}", env=_env(options))
    assert run.code == 2
    (line,) = run.stderr.strip().splitlines()
    assert line.startswith("dflashdoctor: --ssh 127.0.0.1: ") and "refused" in line


def test_a_cache_root_on_a_network_filesystem_is_named_once(tmp_path, sshfs_folder):
    triton_root = sshfs_folder / "triton"
    triton_root.mkdir()
    variables = {"TRITON_CACHE_DIR": str(triton_root), "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}
    run = run_cli(tmp_path, "env", env=variables)
    assert run.code == 0, run.stdout[-3000:] + run.stderr[-2000:]
    (shared,) = [f for f in run.report["results"][0]["findings"] if f["code"] == "cache-shared-filesystem"]
    assert shared["severity"] == "warning" and "fuse.sshfs" in shared["title"] and str(triton_root) in shared["title"]
    # In the gate, env and cache check both see it: the report names it once, in the cache section,
    # whichever runs first.
    (tmp_path / "dflashdoctor.toml").write_text('probes = ["cache", "env"]\n')
    gate = run_cli(tmp_path, "gate", env=variables)
    found = [(r["probe"], f["title"]) for r in gate.report["results"] for f in r["findings"]]
    assert [probe for probe, title in found if "fuse.sshfs" in title] == ["cache"], found
    env_checks = {c["name"]: c["summary"] for c in gate.report["results"][1]["checks"]}
    assert "in another section" in env_checks["cache places"] and "another" not in env_checks["hazards"]
