"""Shared helpers: the CLI runs as a real child process, exactly as a user runs it (`cli`), or, for
what the doctor's own process does, in this one through `cli.main(argv)` (`cli_here`, `main_here`);
GPU tests keep their reports where DFLASHDOCTOR_EVIDENCE_DIR says."""

from __future__ import annotations

import contextlib
import io
import json
import locale
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

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
    (shared by the tests that need an interpreter unlike the one running them, and by the run's
    pytest-xdist workers: the first to ask makes it, under a lock, the others wait and reuse it)."""
    import fcntl

    import torch

    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base  # the run's own folder
    venv = shared / "no-triton-venv"
    python = str(venv / "bin" / "python")
    requirement = f"torch=={torch.__version__.split('+')[0]}"
    with open(shared / "no-triton-venv.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        made = shared / "no-triton-venv.made"
        if not made.exists():
            _make_venv_without_triton(venv, requirement)
            made.write_text(requirement)
    probe = "import importlib.util, sys; sys.exit(importlib.util.find_spec('triton') is not None)"
    assert subprocess.run([python, "-c", probe]).returncode == 0
    return python


def _make_venv_without_triton(venv: Path, requirement: str) -> None:
    shutil.rmtree(venv, ignore_errors=True)  # a worker that died making it left it half made
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    done = subprocess.run([python, "-m", "pip", "install", "-q", requirement], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"could not install {requirement} into a new venv: {done.stderr.strip()[-300:]}")
    # A CUDA torch from PyPI brings triton along; a CPU-only one does not: make it so either way.
    subprocess.run([python, "-m", "pip", "uninstall", "-q", "-y", "triton"], capture_output=True)


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


def _with_report_dir(tmp_path: Path, args: tuple[str, ...]) -> tuple[list[str], Path]:
    """The CLI's arguments with `--report-dir tmp_path/report` after the command's words (options go
    before the command's own args, which may end with `-- ARGS` for a traced script)."""
    report_dir = tmp_path / "report"
    words = 2 if args[0] in _COMMAND_GROUPS else 1  # `cache check`: the command is two words
    return [*args[:words], "--report-dir", str(report_dir), *args[words:]], report_dir


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
    argv, report_dir = _with_report_dir(tmp_path, args)
    proc = subprocess.run(
        [*prefix, sys.executable, "-m", "dflashdoctor", *argv],
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


_HANDLED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)  # `run` sets handlers
# A fresh interpreter's warning filters (PYTHONWARNINGS unset), where pytest's record every warning
_FRESH_WARNING_FILTERS = [
    ("default", None, DeprecationWarning, "__main__", 0),
    ("ignore", None, DeprecationWarning, None, 0),
    ("ignore", None, PendingDeprecationWarning, None, 0),
    ("ignore", None, ImportWarning, None, 0),
    ("ignore", None, ResourceWarning, None, 0),
]


@contextlib.contextmanager
def _warnings_as_a_fresh_interpreter() -> Iterator[None]:
    """A warning the doctor's process gives is printed on its stderr, as a child's would be, not
    recorded by pytest: a line more there is what the one-line tests must see."""

    def show(message, category, filename, lineno, file=None, line=None) -> None:
        sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line))

    with warnings.catch_warnings():
        warnings.resetwarnings()  # no filter, and what each module was told once is forgotten
        warnings.filters.extend(_FRESH_WARNING_FILTERS)
        warnings.showwarning = show
        yield


@contextlib.contextmanager
def _output_captured() -> Iterator[tuple[IO[bytes], IO[bytes]]]:
    """File descriptors 1 and 2 on temporary files, and sys.stdout and sys.stderr new text streams on
    them as a fresh interpreter's would be (encoding and error handler of this interpreter's own
    stdio, which this environment chose): what the doctor prints, and what the processes it starts
    write to the descriptors they inherit, lands in the files as in a child's pipes."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        streams = sys.stdout, sys.stderr
        for stream in streams:
            stream.flush()
        saved = os.dup(1), os.dup(2)
        try:
            os.dup2(out.fileno(), 1)
            os.dup2(err.fileno(), 2)
            fresh = []
            for fd, like in ((1, sys.__stdout__ or streams[0]), (2, sys.__stderr__ or streams[1])):
                raw = io.FileIO(fd, "w", closefd=False)
                fresh.append(io.TextIOWrapper(raw, encoding=like.encoding, errors=like.errors, write_through=True))
            sys.stdout, sys.stderr = fresh
            try:
                yield out, err
            finally:
                for stream in fresh:
                    with contextlib.suppress(OSError, ValueError):
                        stream.flush()
                sys.stdout, sys.stderr = streams
        except BaseException:  # the call raised past cli.main: what it printed goes with the error
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for file in (out, err):
                file.seek(0)
                sys.stderr.write(file.read().decode(errors="backslashreplace"))
            raise
        finally:
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])


def _read(file: IO[bytes], errors: str) -> str:
    file.seek(0)
    return file.read().decode(locale.getpreferredencoding(False), errors)  # as subprocess's text=True reads


def run_main_here(
    cwd: Path, argv: Sequence[str], env: dict[str, str | None] | None = None, errors: str = "strict"
) -> subprocess.CompletedProcess[str]:
    """`dflashdoctor ARGV` in this process: dflashdoctor.cli.main(ARGV), in `cwd`, with `env` added
    to the environment (None removes a variable), stdout and stderr captured (decoded with `errors`,
    as `subprocess.run(..., errors=...)` would), and the exit code it returns; a warning is printed on
    its stderr, as a fresh interpreter prints it. The working folder, the environment,
    sys.stdout/stderr, file descriptors 1 and 2, the warning filters and the signal handlers `run`
    sets are restored, also when the call raises."""
    from dflashdoctor.cli import main

    handlers = {number: signal.getsignal(number) for number in _HANDLED_SIGNALS}
    with pytest.MonkeyPatch.context() as patch, _output_captured() as (out, err), _warnings_as_a_fresh_interpreter():
        patch.chdir(cwd)
        for name, value in (env or {}).items():
            if value is None:
                patch.delenv(name, raising=False)
            else:
                patch.setenv(name, value)
        try:
            code = main(list(argv))
        finally:
            for number, handler in handlers.items():
                signal.signal(number, handler if handler is not None else signal.SIG_DFL)
        sys.stdout.flush()
        sys.stderr.flush()
        stdout, stderr = _read(out, errors), _read(err, errors)
    return subprocess.CompletedProcess(["dflashdoctor", *argv], code, stdout, stderr)


def run_cli_here(tmp_path: Path, *args: str, env: dict[str, str | None] | None = None) -> CliRun:
    """run_cli's call, made in this process (run_main_here): the same arguments, report folder and
    working folder."""
    argv, report_dir = _with_report_dir(tmp_path, args)
    done = run_main_here(tmp_path, argv, env)
    return CliRun(done.returncode, done.stdout, done.stderr, report_dir)


@pytest.fixture
def cli_here(tmp_path: Path):
    """`cli`, run in this process instead of a child `python -m dflashdoctor` (half a second to a
    second of interpreter start and imports each call): for what the doctor's own process does,
    which is most of what the CLI does before or without a probe (bad input refused, option parsing,
    `show`, `merge`, `lint`, `init`, the gate's configuration, report folder and --junit/--sarif
    checks, `cache` on local roots, exit codes). A probe, a `run`'s program, ssh or torchrun still
    start as child processes where the command reaches one.

    Not for a test whose point is the doctor's process itself: one that signals or kills the doctor
    (SIGTERM, SIGKILL), runs it under `prefix` (setpriv) or as another user, feeds it stdin, pipes its
    --json to another process, gives it a stdout of its own (/dev/full), checks what a fresh
    interpreter imports or compiles, or feeds it input that could crash or hang an interpreter (the
    child's timeout is not enforced here; pytest-timeout's is): those keep `cli` (run_cli).
    `timeout` is taken for `cli`'s signature and not enforced."""

    def invoke(*args: str, timeout: float = 600, env: dict[str, str | None] | None = None) -> CliRun:
        del timeout  # a call in this process cannot be given up on; pytest-timeout's limit still holds
        return run_cli_here(tmp_path, *args, env=env)

    return invoke


@pytest.fixture
def main_here(tmp_path: Path):
    """`python -m dflashdoctor ARGV` as a test's own subprocess.run would give it (a CompletedProcess,
    nothing added to ARGV, in `cwd`, default the test's tmp_path), run in this process: cli_here says
    when that is the same and when not."""

    def invoke(
        *argv: str, cwd: Path | None = None, env: dict[str, str | None] | None = None, errors: str = "strict"
    ) -> subprocess.CompletedProcess[str]:
        return run_main_here(cwd or tmp_path, argv, env, errors)

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
