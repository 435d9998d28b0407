"""Starting the user's command so that every Python process it starts loads the agent.

A temporary folder holds a copy of the bootstrap `sitecustomize.py` and, under `_package/`, a link to
this dflashdoctor package, and goes first on PYTHONPATH. The bootstrap uses the program's own
dflashdoctor when it is this version, else the package the link points to (imported from its real
path, so the report's file names outlive this folder): a child interpreter from another environment
then finds the agent without the doctor's whole site-packages (another torch) on its path.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import dflashdoctor
from dflashdoctor.agent.config import EVENTS_DIR, SETTINGS, VERSION, RunSettings
from dflashdoctor.errors import BadInput

_BOOTSTRAP = Path(dflashdoctor.__file__).parent / "agent" / "bootstrap" / "sitecustomize.py"


def resolve_command(command: list[str]) -> list[str]:
    if not command:
        raise BadInput("nothing to run: put the command after --, e.g. dflashdoctor run -- python train.py")
    program = shutil.which(command[0])
    if program is None:
        raise BadInput(f"command not found: {command[0]}")
    return [program, *command[1:]]


def bootstrap_folder() -> Path:
    folder = Path(tempfile.mkdtemp(prefix="dflashdoctor-bootstrap-"))
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


def start(command: list[str], env: dict[str, str], *, stdout_to_stderr: bool = False) -> subprocess.Popen[bytes]:
    """Its own session, so that the doctor can stop the whole tree (torchrun and its workers) at
    once; stdin, stdout and stderr are the doctor's own, so the output passes through untouched,
    except that with `stdout_to_stderr` (--json) the command's stdout goes to stderr: the doctor's
    stdout then carries the one JSON report and nothing else."""
    try:
        stdout = sys.stderr.fileno() if stdout_to_stderr else None
        return subprocess.Popen(command, env=env, start_new_session=True, stdout=stdout)
    except OSError as exc:  # executable but not a program the kernel can start (no shebang, ...)
        raise BadInput(f"cannot start {command[0]}: {exc.strerror}") from None
