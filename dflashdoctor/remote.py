"""Running a probe on another machine through the system's ssh client, as the original debugging did.

The probe code travels with the command: a gzipped tar of the dflashdoctor package and the probe
scripts on ssh's stdin, unpacked into a fresh temporary folder there (removed on exit); the remote
machine needs only Python with torch. The result comes back on stdout after a marker line. Every
value that reaches the remote shell (interpreter, environment values) is quoted with shlex: targets
and paths cannot inject shell code. `DFLASHDOCTOR_SSH_OPTIONS` adds options to ssh (`-F config`,
`-i key`); BatchMode is always on, so a missing key fails at once instead of prompting.
"""

from __future__ import annotations

import io
import json
import os
import re
import shlex
import subprocess
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dflashdoctor.errors import BadInput
from dflashdoctor.probe_configs import ProbeConfig, to_json

MARKER = "@@dflashdoctor-result@@"
# matched whole (fullmatch): `$` alone would also take a spec that ends in a newline ("host\n")
_SPEC = re.compile(r"(?:(?P<user>[A-Za-z0-9._-]+)@)?(?P<host>[A-Za-z0-9._-]+|\[[0-9A-Fa-f:.]+\])(?::(?P<port>[0-9]+))?")
_TAIL_CHARS = 6000


@dataclass(frozen=True)
class SshTarget:
    host: str
    user: str | None = None
    port: int | None = None

    @classmethod
    def parse(cls, spec: str) -> SshTarget:
        match = _SPEC.fullmatch(spec)
        if not match or spec.startswith("-"):
            raise BadInput(f"--ssh {spec!r}: expected [user@]host[:port]")
        port = int(match["port"]) if match["port"] else None
        if port is not None and not 0 < port < 65536:
            raise BadInput(f"--ssh {spec!r}: port {port} is out of range")
        return cls(host=match["host"].strip("[]"), user=match["user"], port=port)

    def ssh_argv(self) -> list[str]:
        try:
            options = shlex.split(os.environ.get("DFLASHDOCTOR_SSH_OPTIONS", ""))
        except ValueError as exc:
            raise BadInput(f"DFLASHDOCTOR_SSH_OPTIONS cannot be split like a shell would: {exc}") from None
        port = ["-p", str(self.port)] if self.port else []
        destination = f"{self.user}@{self.host}" if self.user else self.host
        return ["ssh", "-o", "BatchMode=yes", *options, *port, "--", destination]


def _bundle(package: Path, probes: Path, config: ProbeConfig) -> bytes:
    """The package and the probes, without caches; the config beside them."""
    buffer = io.BytesIO()

    def skip_caches(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
        return None if "__pycache__" in info.name.split("/") else info

    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        tar.add(package, arcname="dflashdoctor", filter=skip_caches)
        tar.add(probes, arcname="probes", filter=skip_caches)
        data = to_json(config).encode()
        info = tarfile.TarInfo("config.json")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def remote_script(python: str, script: str, env: dict[str, str], timeout_s: float) -> str:
    """The POSIX shell script run there; every outside value in it is quoted. Killing the local ssh
    does not stop the remote probe (no pty), so the probe runs under `timeout` there when it exists."""
    assignments = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items() if re.fullmatch(r"[A-Z_][A-Z0-9_]*", k))
    return (
        'd=$(mktemp -d "${TMPDIR:-/tmp}/dflashdoctor-XXXXXX") || exit 97\n'
        "trap 'rm -rf \"$d\"' EXIT\n"
        'tar xzf - -C "$d" || exit 98\n'
        f'limit=""; command -v timeout >/dev/null 2>&1 && limit="timeout -k 10 {int(timeout_s)}"\n'
        f'$limit env PYTHONPATH="$d${{PYTHONPATH:+:$PYTHONPATH}}" PYTHONUNBUFFERED=1 {assignments} '
        f'{shlex.quote(python)} "$d/probes/{script}" --config "$d/config.json" --out "$d/result.json" >&2\n'
        "rc=$?\n"
        f'printf "\\n%s %s\\n" {MARKER} "$rc"\n'
        'cat "$d/result.json" 2>/dev/null\n'
        "exit 0\n"
    )


_NOT_FOUND = 127  # POSIX shells: the command was not found


@dataclass
class RemoteRun:
    returncode: int | None
    duration_s: float
    timed_out: bool
    payload: dict[str, Any] | None
    stderr_tail: str
    argv: list[str]


def run_remote(
    target: SshTarget,
    script: str,  # the probe's file in probes/
    config: ProbeConfig,
    *,
    python: str,
    package: Path,
    probes: Path,
    timeout_s: float,
    env: dict[str, str],
) -> RemoteRun:
    argv = [*target.ssh_argv(), "sh", "-c", shlex.quote(remote_script(python, script, env, timeout_s))]
    started = time.monotonic()
    try:
        done = subprocess.run(argv, input=_bundle(package, probes, config), capture_output=True, timeout=timeout_s)
    except subprocess.TimeoutExpired as exc:
        tail = (exc.stderr or b"")[-_TAIL_CHARS:].decode(errors="replace")
        return RemoteRun(None, round(time.monotonic() - started, 3), True, None, tail, argv)
    except FileNotFoundError:
        raise BadInput("--ssh needs the ssh client, and there is no `ssh` on PATH") from None
    stdout = done.stdout.decode(errors="replace")
    stderr_tail = done.stderr[-_TAIL_CHARS:].decode(errors="replace")
    _, marker, rest = stdout.partition(MARKER)
    if not marker:  # ssh itself failed: no connection, no key, the host refused
        last = (stderr_tail.strip().splitlines() or [f"ssh exited with {done.returncode}"])[-1]
        raise BadInput(f"--ssh {target.host}: {last}")
    code_text, _, document = rest.strip().partition("\n")
    try:
        payload = json.loads(document) if document.strip() else None
    except json.JSONDecodeError:
        payload = None
    code = int(code_text) if code_text.strip().lstrip("-").isdigit() else None
    if code == _NOT_FOUND and payload is None:  # the shell found no such program there
        raise BadInput(f"--ssh {target.host}: no `{python}` there (exit 127): give --python its path on that machine")
    return RemoteRun(code, round(time.monotonic() - started, 3), False, payload, stderr_tail, argv)
