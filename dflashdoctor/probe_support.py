"""What every probe needs to talk to the doctor: its config in, one JSON document out.

Probed side, standard library only. The doctor starts a probe as
`python probes/<name>.py --config CONFIG.json --out RESULT.json`; the probe reads CONFIG.json as
its typed config (probe_configs.py, strictly: one the probe does not read is a failure naming
where) and writes RESULT.json atomically, so a probe that dies mid-write leaves no half document
for the doctor to misread.
A probe signals bad input by raising `UsageError`: the doctor turns it into one line and exit 2.
SIGUSR1 makes the probe print every thread's stack to stderr, which the doctor asks for before
killing a probe that ran past its timeout. A probe whose parent (the doctor, or the gate's probe
host) dies, even by SIGKILL, kills itself and its process group within a second or so.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any, TypeVar

from dflashdoctor.errors import BadInput, MissingPackage
from dflashdoctor.probe_configs import load_config
from dflashdoctor.processes import pid_alive
from dflashdoctor.redaction import redact_text


class UsageError(BadInput):
    """Bad input found on the probed side (no such module, impossible shape, no CUDA, ...): sent to
    the doctor in the probe's document, and bad input there too."""


PROBE_PACKAGES = ("torch", "triton", "transformers", "fla")  # what probes import themselves


def missing_package(exc: ModuleNotFoundError, interpreter: str) -> MissingPackage | None:
    """A probe's own import of a package the interpreter does not have, as bad input naming both."""
    package = (exc.name or "").split(".")[0]
    if package not in PROBE_PACKAGES:
        return None
    return MissingPackage(
        package,
        f"{interpreter} has no {package} (No module named {exc.name!r}): install it there, or give --python "
        "an interpreter that has it",
    )


def first_line(text: str | None, empty: str = "(no message)") -> str:
    """The first line of an exception's message or a reason, which may be empty (`MemoryError()`,
    a bare `assert`): `empty` then, never an IndexError."""
    lines = (text or "").strip().splitlines()
    return lines[0] if lines else empty


def resolve_device(requested: str) -> str:
    """`auto` becomes cuda where torch sees a GPU; cuda where it sees none is bad input."""
    import torch

    if requested == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if requested == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda was asked for, but torch sees no CUDA device here")
    return requested


def write_json_atomically(path: str, payload: dict[str, Any]) -> None:
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as handle:
        json.dump(payload, handle, default=str)
    os.replace(tmp, path)


_PARENT_POLL_S = 1.0
# The pid of the process that started the probe (the doctor, or the gate's probe host), set by it:
# a parent that died before the probe got this far (importing torch takes seconds) is still seen.
PARENT_VARIABLE = "DFLASHDOCTOR_PROBE_PARENT"


def _expected_parent() -> int:
    """Who started this probe; taken out of the environment, so that what the probe starts in turn
    (its own helpers) does not mistake it for theirs. A value that names a live process other than
    the parent (one left in a user's environment, or garbage) is not believed: only a parent that
    is gone can differ from the one given."""
    given = os.environ.pop(PARENT_VARIABLE, "")
    parent = os.getppid()
    if not given.isdigit() or int(given) in (0, parent) or pid_alive(int(given)):
        return parent
    return int(given)


def _die_with_parent() -> None:
    """A doctor killed with SIGKILL cannot stop its probes, and a probe left running holds a GPU, a
    compile's CPUs or a hang for as long as its own work lasts. So a probe watches its parent: once
    it is reparented (its parent gone), it kills itself and, where it leads its process group (as
    every probe the doctor starts does), everything in that group."""
    parent = _expected_parent()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(_PARENT_POLL_S)
        pid = os.getpid()
        if os.getpgid(0) == pid:
            os.killpg(pid, signal.SIGKILL)
        os.kill(pid, signal.SIGKILL)

    threading.Thread(target=watch, name="dflashdoctor-parent-watch", daemon=True).start()


C = TypeVar("C")


def probe_main(run: Callable[[C], dict[str, Any]], config_type: type[C]) -> None:
    """Entry point of a probe script: parse argv, load its config as `config_type`, run, write the
    result or the usage error. A config it cannot load is the probe's failure (the doctor sent it)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    _die_with_parent()
    if hasattr(signal, "SIGUSR1"):
        faulthandler.register(signal.SIGUSR1, all_threads=True)
    with open(args.config, encoding="utf-8") as handle:
        config = json.load(handle)
    try:
        try:
            payload = run(load_config(config_type, config))
        except ModuleNotFoundError as exc:
            raise missing_package(exc, sys.executable) or exc from None
    except BadInput as exc:  # a UsageError, or a MissingPackage
        payload = {"usage_error": str(exc)}
        if isinstance(exc, MissingPackage):
            payload["missing_package"] = exc.package
    except Exception as exc:  # the probe's own failure: still a document, so the doctor can say what broke
        payload = {  # its traceback may chain the target's exception, quoting a secret: redacted, then cut
            "probe_error": redact_text(f"{type(exc).__name__}: {exc}"),
            "traceback": redact_text(traceback.format_exc())[-4000:],
        }
    write_json_atomically(args.out, payload)
    # The result is on disk; skip interpreter teardown. After a compile, teardown joins Inductor's
    # compile-worker pool and tears down CUDA, which took seconds of every probe run on an H200.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
