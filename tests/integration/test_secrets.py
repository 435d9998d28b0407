"""No file a report folder holds keeps a secret: environment values the env probe reads, a token on
the command line of a program under `run`, or one in the message of an exception it raised. They
are redacted where they enter (redaction.py), so the renderings, observations.json and the event
logs alike are clean; the terminal and --json output too. `env` runs in this process (its probe is a
child process, with the secrets in its environment); `run` as a real child process."""

from __future__ import annotations

import stat
import sys
from pathlib import Path

from tests.conftest import run_cli, run_cli_here

TOKEN = "hf_secretvalue0123456789"
PASSWORD = "pw0rd-not-for-reports"
GITHUB = "ghp_0123456789abcdefghijABCDEFGHIJ"


def _holding(folder: Path, secrets: tuple[str, ...]) -> list[str]:
    """Every file under `folder` that holds one of the secrets, with the secret."""
    found = []
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        data = path.read_bytes()
        found += [f"{path.relative_to(folder)}: {s}" for s in secrets if s.encode() in data]
    return found


def test_env_keeps_no_secret_in_any_file(tmp_path):
    env = {"HF_TOKEN": TOKEN, "TORCH_MIRROR": f"https://bob:{PASSWORD}@mirror.example/x", "TRITON_EXTRA": GITHUB}
    run = run_cli_here(tmp_path, "env", env=env)
    assert run.code == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert not _holding(run.report_dir, (TOKEN, PASSWORD, GITHUB))
    assert TOKEN not in run.stdout and PASSWORD not in run.stdout
    assert stat.S_IMODE((run.report_dir / "observations.json").stat().st_mode) == 0o600


def test_run_keeps_no_secret_from_the_command_line_or_the_programs_exception(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(
        f"import sys\nraise RuntimeError('push to https://bob:{PASSWORD}@hub.example refused for ' + sys.argv[2])\n"
    )
    argv = ("--hf-token", TOKEN, "--push-url", f"https://bob:{PASSWORD}@hub.example/x", GITHUB)
    run = run_cli(tmp_path, "run", "--", sys.executable, str(script), *argv)
    assert run.code == 1, run.stdout[-2000:] + run.stderr[-2000:]
    assert not _holding(run.report_dir, (TOKEN, PASSWORD, GITHUB))
    assert TOKEN not in run.stdout and PASSWORD not in run.stdout
    events = list((run.report_dir / "events").glob("*.jsonl"))
    assert events and all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in events)
    assert "<redacted>" in run.report["argv"][-1] or "<redacted>" in " ".join(run.report["argv"])
