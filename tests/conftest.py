"""Shared helpers: the CLI runs as a real child process, exactly as a user runs it; GPU tests keep
their reports where DFLASHDOCTOR_EVIDENCE_DIR says."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests import schemas

TARGETS = Path(__file__).parent / "targets"


@pytest.fixture
def fresh_dynamo():
    """Dynamo reset before and after a test that compiles in this process, so no recompile limit or
    skipped frame leaks into later tests."""
    import torch

    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.fixture
def evidence(request, tmp_path) -> Path:
    """Where a test's report goes: the evidence folder under the test's name, else a temporary one."""
    root = os.environ.get("DFLASHDOCTOR_EVIDENCE_DIR")
    base = Path(root) / request.node.name.removeprefix("test_") if root else tmp_path
    base.mkdir(parents=True, exist_ok=True)
    return base


@pytest.fixture(scope="session")
def venv_without_triton(tmp_path_factory) -> str:
    """A virtual environment with this torch and its dependencies only, as a CPU-only install has
    (shared by the tests that need an interpreter unlike the one running them)."""
    import torch

    venv = tmp_path_factory.mktemp("no-triton") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    requirement = f"torch=={torch.__version__.split('+')[0]}"
    done = subprocess.run([python, "-m", "pip", "install", "-q", requirement], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"could not install {requirement} into a new venv: {done.stderr.strip()[-300:]}")
    # A CUDA torch from PyPI brings triton along; a CPU-only one does not: make it so either way.
    subprocess.run([python, "-m", "pip", "uninstall", "-q", "-y", "triton"], capture_output=True)
    probe = "import importlib.util, sys; sys.exit(importlib.util.find_spec('triton') is not None)"
    assert subprocess.run([python, "-c", probe]).returncode == 0
    return python


@pytest.fixture(scope="session")
def sarif_schema(request) -> Path:
    """SARIF 2.1.0's published JSON schema (tests/schemas.py says where it comes from)."""
    return schemas.fetch(schemas.SARIF_2_1_0, request.config.cache.mkdir("published-schemas"))


@pytest.fixture(scope="session")
def junit_schemas(request) -> list[Path]:
    """The JUnit XSDs Jenkins' xunit plugin reads, two revisions."""
    cache = request.config.cache.mkdir("published-schemas")
    return [schemas.fetch(schema, cache) for schema in schemas.JENKINS_JUNIT]


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _cuda_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@dataclass
class CliRun:
    code: int
    stdout: str
    stderr: str
    report_dir: Path

    @property
    def report(self) -> dict[str, Any]:
        return json.loads((self.report_dir / "report.json").read_text())

    def findings(self, code: str | None = None) -> list[dict[str, Any]]:
        found = [f for r in self.report["results"] for f in r["findings"]]
        return [f for f in found if code is None or f["code"] == code]

    def codes(self) -> set[str]:
        return {f["code"] for f in self.findings()}

    def check(self, name: str) -> dict[str, Any]:
        return next(c for r in self.report["results"] for c in r["checks"] if c["name"] == name)


_COMMAND_GROUPS = ("cache",)


def run_cli(
    tmp_path: Path,
    *args: str,
    timeout: float = 600,
    env: dict[str, str | None] | None = None,
    prefix: tuple[str, ...] = (),
) -> CliRun:
    """Runs the CLI in a child process; `prefix` wraps it (e.g. `setpriv ...` to drop privileges).
    `env` adds to this process's environment; a None value removes the variable."""
    environment = {**os.environ, **(env or {})}
    report_dir = tmp_path / "report"
    words = 2 if args[0] in _COMMAND_GROUPS else 1  # `cache check`: the command is two words
    proc = subprocess.run(
        # options go before the command's own args, which may end with `-- ARGS` for a traced script
        [*prefix, sys.executable, "-m", "dflashdoctor", *args[:words], "--report-dir", str(report_dir), *args[words:]],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=tmp_path,
        env={k: v for k, v in environment.items() if v is not None},
    )
    return CliRun(proc.returncode, proc.stdout, proc.stderr, report_dir)


@pytest.fixture
def cli(tmp_path: Path):
    def invoke(*args: str, timeout: float = 600, env: dict[str, str] | None = None) -> CliRun:
        return run_cli(tmp_path, *args, timeout=timeout, env=env)

    return invoke


_CAPABILITIES = "-dac_override,-dac_read_search"  # what lets root read and write past permissions
_NO_READ_OVERRIDE = ("setpriv", f"--bounding-set={_CAPABILITIES}", f"--inh-caps={_CAPABILITIES}")


def permissions_apply(tmp_path: Path) -> tuple[str, ...]:
    """A prefix under which file permissions bind: none for a plain user; as root, `setpriv` without
    the capabilities that let root read anything (skip where it cannot drop them)."""
    if os.geteuid() != 0:
        return ()
    probe = tmp_path / "permission-probe"
    probe.mkdir(mode=0)
    try:
        refused = subprocess.run([*_NO_READ_OVERRIDE, "ls", str(probe)], capture_output=True).returncode != 0
    except FileNotFoundError:
        refused = False
    finally:
        probe.rmdir()
    if not refused:
        pytest.skip("running as root, and setpriv cannot drop the read-override capabilities")
    return _NO_READ_OVERRIDE


_NOBODY = ("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all", "--bounding-set=-all")


@pytest.fixture
def shared():
    """A world-writable sticky folder like /tmp, that nobody can reach (tmp_path is private to root)."""
    folder = Path(tempfile.mkdtemp(prefix="dflashdoctor-shared-", dir="/tmp"))
    folder.chmod(0o1777)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def start_as_nobody(argv: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
    """A long-running process of the unprivileged user `nobody`, for attacks that need one alive."""
    if os.geteuid() != 0:
        pytest.skip("acting as another local user needs root (setpriv to nobody)")
    try:
        return subprocess.Popen([*_NOBODY, *argv], env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    except FileNotFoundError:
        pytest.skip("setpriv (util-linux) is not installed")


def as_nobody(script: str) -> None:
    """Runs a shell script as the unprivileged user `nobody` (uid 65534): another local user, for
    attacks on a command root runs. Skips where this process cannot change user (not root, no setpriv)."""
    if os.geteuid() != 0:
        pytest.skip("acting as another local user needs root (setpriv to nobody)")
    try:
        done = subprocess.run([*_NOBODY, "sh", "-ec", script], capture_output=True, text=True, timeout=60)
    except FileNotFoundError:
        pytest.skip("setpriv (util-linux) is not installed")
    assert done.returncode == 0, done.stderr
