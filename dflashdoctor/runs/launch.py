"""Starting the user's command so that every Python process it starts loads the agent, and so that
nothing it starts outlives the doctor.

A temporary folder holds a copy of the bootstrap `sitecustomize.py` and, under `_package/`, a link to
this dflashdoctor package, and goes first on PYTHONPATH. The bootstrap uses the program's own
dflashdoctor when it is this version, else the package the link points to (imported from its real
path, so the report's file names outlive this folder): a child interpreter from another environment
then finds the agent without the doctor's whole site-packages (another torch) on its path.

The command's parent is runs/launcher.py, a child subreaper in a session of its own that watches the
doctor: when the doctor is done with the run, or is killed, it ends whatever of the command still
runs and removes the run's temporary folders.
"""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType

import dflashdoctor
from dflashdoctor import cgroup
from dflashdoctor.agent.config import EVENTS_DIR, SETTINGS, VERSION, RunSettings
from dflashdoctor.errors import BadInput
from dflashdoctor.leftovers import Lineage
from dflashdoctor.processes import process_table

_BOOTSTRAP = Path(dflashdoctor.__file__).parent / "agent" / "bootstrap" / "sitecustomize.py"
_LAUNCHER = Path(__file__).with_name("launcher.py")
_LAUNCHER_END_S = 30.0  # the launcher's worst case: SIGTERM, its grace, SIGKILL, the folders removed


def resolve_command(command: list[str]) -> list[str]:
    if not command:
        raise BadInput("nothing to run: put the command after --, e.g. dflashdoctor run -- python train.py")
    program = shutil.which(command[0])
    if program is None:
        raise BadInput(f"command not found: {command[0]}")
    return [program, *command[1:]]


def bootstrap_folder(parent: Path | None = None) -> Path:
    """A new folder holding the bootstrap, in `parent` (removed with it) or the temporary folder."""
    folder = Path(tempfile.mkdtemp(prefix="dflashdoctor-bootstrap-", dir=parent))
    shutil.copy(_BOOTSTRAP, folder / "sitecustomize.py")
    (folder / "_package").mkdir()
    (folder / "_package" / "dflashdoctor").symlink_to(Path(dflashdoctor.__file__).parent, target_is_directory=True)
    return folder


def child_environment(bootstrap: Path, events: Path, settings: RunSettings) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(bootstrap), *filter(None, [env.get("PYTHONPATH")])])
    env[EVENTS_DIR] = str(events.resolve())
    env[SETTINGS] = settings.to_env()
    env[VERSION] = dflashdoctor.__version__
    return env


class Launched:
    """The command, started by runs/launcher.py, with the part of Popen's interface `watch` uses:
    `pid` is the command's own (the leader of its process group, in the launcher's session), and its
    exit status comes from the launcher, which reaps it. Leaving the `with` block ends the launcher:
    what of the command still runs is ended, and the temporary folders go."""

    def __init__(
        self, launcher: subprocess.Popen[bytes], status: int, control: int, marker: str, temporary: list[Path]
    ) -> None:
        self._launcher = launcher
        self._status = status
        self._control = control
        self._temporary = temporary
        self._buffer = b""
        self.marker = marker
        self.pid = 0
        self.returncode: int | None = None
        self.cgroup: Path | None = None

    def _said(self, timeout: float | None) -> str | None:
        """The launcher's next line, waiting up to `timeout`; "" once it has ended."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self._buffer:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not select.select([self._status], [], [], left)[0]:
                return None
            data = os.read(self._status, 4096)
            if not data:
                return ""
            self._buffer += data
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line.decode()

    def started(self, program: str) -> None:
        """The command's pid, once the launcher has started it; bad input where the kernel would not
        start it (no shebang, ...), after the launcher has removed the temporary folders."""
        first = self._said(None) or ""
        if first.startswith("pid "):
            self.pid = int(first.split()[1])
            return
        self.close()
        if first.startswith("error "):
            raise BadInput(f"cannot start {program}: {os.strerror(int(first.split()[1]))}")
        raise RuntimeError(f"run's launcher ended before it started the command (exit {self._launcher.returncode})")

    def fileno(self) -> int:
        """Readable when the launcher has something to say (the command's exit): a watch sleeps on it."""
        return self._status

    def poll(self) -> int | None:
        return self._ended(0)

    def wait(self, timeout: float | None = None) -> int:
        code = self._ended(timeout)
        if code is None:
            raise subprocess.TimeoutExpired(f"command {self.pid}", timeout or 0.0)
        return code

    def _ended(self, timeout: float | None) -> int | None:
        """The command's exit status once the launcher has said it. A launcher that ended without
        saying it (killed by someone) gives its own: the command's is lost with it."""
        while self.returncode is None:
            line = self._said(timeout)
            if line is None:
                return None
            if line == "":
                self.returncode = self._launcher.wait()
            elif line.startswith("exit "):
                self.returncode = int(line.split()[1])
        return self.returncode

    def lineage(self) -> Lineage:
        """What marks the command's descendants (leftovers.py). The launcher's session and tree only
        while it runs: this doctor, its parent, then reaps it no sooner than `close`, so its pid stays
        its own meanwhile; a launcher reaped already (killed by someone) has a pid free for reuse."""
        launcher = self._launcher.pid if self._launcher.poll() is None else 0
        return Lineage(self.marker, group=self.pid, session=launcher, root=launcher, cgroup=self.cgroup)

    def __enter__(self) -> Launched:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        """The doctor is done with the run (or stopped mid-way): the launcher ends what still runs,
        removes the temporary folders and exits; waited for, so that the doctor ends after it. The
        folders are removed here too, for a launcher that was killed."""
        os.close(self._control)
        with contextlib.suppress(subprocess.TimeoutExpired):  # one it cannot end (unkillable): left to it
            self._launcher.wait(timeout=_LAUNCHER_END_S)
        os.close(self._status)
        for folder in self._temporary:
            shutil.rmtree(folder, ignore_errors=True)


def start(
    command: list[str], env: dict[str, str], temporary: list[Path], *, stdout_to_stderr: bool = False
) -> Launched:
    """The command under runs/launcher.py, in a process group of its own in the launcher's session,
    so that the doctor can stop the whole tree (torchrun and its workers) at once; stdin, stdout and
    stderr are the doctor's own, so the output passes through untouched, except that with
    `stdout_to_stderr` (--json) the command's stdout goes to stderr: the doctor's stdout then carries
    the one JSON report and nothing else. `temporary`: folders removed when the run ends, also when
    the doctor is killed before it could remove them."""
    own_cgroup = cgroup.private_to(os.getpid(), process_table())  # before the command can start anything
    control, held = os.pipe()  # only the doctor holds `held`: its end, however it comes, ends `control`
    status, said = os.pipe()
    argv = [sys.executable, "-I", "-S", str(_LAUNCHER), str(control), str(said), *map(str, temporary), "--", *command]
    try:
        stdout = sys.stderr.fileno() if stdout_to_stderr else None
        launcher = subprocess.Popen(argv, env=env, start_new_session=True, stdout=stdout, pass_fds=(control, said))
    except BaseException:
        for fd in (held, status):
            os.close(fd)
        for folder in temporary:
            shutil.rmtree(folder, ignore_errors=True)
        raise
    finally:
        os.close(control)
        os.close(said)
    launched = Launched(launcher, status, held, f"{EVENTS_DIR}={env[EVENTS_DIR]}", temporary)
    launched.cgroup = own_cgroup
    launched.started(command[0])
    return launched
