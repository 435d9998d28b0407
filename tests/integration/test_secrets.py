"""No file a report folder holds keeps a secret: environment values the env probe reads, a token on
the command line of a program under `run`, or one in the message of an exception it raised. They
are redacted where they enter (redaction.py), so the renderings, observations.json and the event
logs alike are clean; the terminal and --json output too. `env` runs in this process (its probe is a
child process, with the secrets in its environment); `run` as a real child process, as do the
probes whose target raises (check-compile, trace-attention's script)."""

from __future__ import annotations

import stat
import sys
from pathlib import Path

import pytest

from tests.conftest import run_cli, run_cli_here

TOKEN = "hf_secretvalue0123456789"
PASSWORD = "pw0rd-not-for-reports"
GITHUB = "ghp_0123456789abcdefghijABCDEFGHIJ"
# Secrets no rule of the pattern kind knows: only their option's name, their header, their place in a
# URL or the secret-named variable that holds them gives them away. Each has its own value, so that
# one rule cannot hide another's miss.
WANDB_OPTION = "a7c3e9f1b5d2468ace0b1d3f5a7c9e2b4d6f8a0c"
PASSPHRASE = "correct-horse-battery-staple-31"
BEARER = "opaque-bearer-9c1f4e2a7b63"
DB_URL, DB_PASSWORD = "postgres://trainer:pa/ss+w0rd@db.example/runs", "pa/ss+w0rd"
S3_URL, S3_SECRET = "s3://AKID:abc/defSecret9@bucket/x", "abc/defSecret9"
WANDB_API_KEY = "3f9a1c7e5b2d4a6c8e0f1a3b5c7d9e1f2a4b6c8d"
AWS_SECRET_ACCESS_KEY = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYzq2Ukd8"
LATE = "set-by-the-program-itself-77"  # in DATASET_SERVICE_TOKEN, set by the program after its imports
JWT = "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiJ0cmFpbmVyIn0.dGhpcy1pcy1ub3QtYS1yZWFsLXNpZ25hdHVyZQ"
ENVIRONMENT = {"WANDB_API_KEY": WANDB_API_KEY, "AWS_SECRET_ACCESS_KEY": AWS_SECRET_ACCESS_KEY}
EVERY_SECRET = (WANDB_OPTION, PASSPHRASE, BEARER, DB_PASSWORD, "ss+w0rd", S3_SECRET, "defSecret9")
EVERY_SECRET += (WANDB_API_KEY, WANDB_API_KEY[:20], AWS_SECRET_ACCESS_KEY, LATE, JWT, JWT.split(".")[1])
# what the program's exception says: the variables' values, a JWT, the URLs and the header
QUOTING = (
    "import os\n"
    f"os.environ['DATASET_SERVICE_TOKEN'] = {LATE!r}\n"
    "MESSAGE = (\n"
    "    f\"wandb rejected {os.environ['WANDB_API_KEY']}; s3 refused {os.environ['AWS_SECRET_ACCESS_KEY']}; \"\n"
    f"    f\"service {{os.environ['DATASET_SERVICE_TOKEN']}}; session {JWT}; \"\n"
    f'    "{DB_URL} and {S3_URL} with Authorization: Bearer {BEARER}"\n'
    ")\n"
    # the key again where a report's cut at 2000 characters would halve it
    "MESSAGE += '\\n' + '.' * (1979 - len(MESSAGE)) + os.environ['WANDB_API_KEY']\n"
)


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


def test_run_keeps_no_secret_option_header_url_credential_or_variables_value_anywhere(tmp_path):
    """`--wandb-key`, `--passphrase`, `-H 'Authorization: Bearer X'` and URLs whose password holds
    `/`, on the program's command line and on that of a child it leaves running (named by the doctor,
    and instrumented: its own start event); the values of secret-named variables, one of them set by
    the program itself, a JWT, the URLs and the header in its exception's message and traceback."""
    script = tmp_path / "train.py"
    script.write_text(
        QUOTING + "import pathlib, subprocess, sys, time\n"
        "sleeper = \"import pathlib, time; pathlib.Path('started').touch(); time.sleep(300)\"\n"
        "subprocess.Popen([sys.executable, '-c', sleeper, *sys.argv[1:]])\n"
        "while not pathlib.Path('started').exists():  # its agent has written its start event\n"
        "    time.sleep(0.05)\n"
        "raise RuntimeError(MESSAGE)\n"
    )
    argv = ("--wandb-key", WANDB_OPTION, f"--passphrase={PASSPHRASE}", "-H", f"Authorization: Bearer {BEARER}")
    argv += ("--db", DB_URL, S3_URL, "--max-tokens", "512", "--tokenizer", "Qwen/Qwen3-8B", "https://host/a@b")
    run = run_cli(tmp_path, "run", "--", sys.executable, str(script), *argv, env=ENVIRONMENT)
    assert run.code == 1, run.stdout[-2000:] + run.stderr[-2000:]
    assert not _holding(run.report_dir, EVERY_SECRET)
    assert not [s for s in EVERY_SECRET if s in run.stdout]
    (raised,) = run.findings("uncaught-exception")  # the message is there, its secrets are not
    assert raised["evidence"]["message"].startswith("wandb rejected <redacted>; s3 refused <redacted>; service")
    (left,) = run.findings("processes-left-running")
    assert "--wandb-key <redacted>" in left["evidence"]["left_running"][0]["command"]
    names = {p.name for p in run.report_dir.iterdir()}
    assert {"report.json", "report.html", "report.md", "junit.xml", "report.sarif", "observations.json"} <= names
    assert len(list((run.report_dir / "events").glob("*.jsonl"))) == 2  # the program and the child it left
    kept = run.report["argv"]  # what a reader needs stays
    assert kept[-5:] == ["--max-tokens", "512", "--tokenizer", "Qwen/Qwen3-8B", "https://host/a@b"]
    assert "postgres://<redacted>@db.example/runs" in kept and "s3://<redacted>@bucket/x" in kept


@pytest.mark.parametrize(
    ("files", "args"),
    [
        (
            {"targets.py": "def fn(q, k, v, block_mask=None, enable_gqa=False):\n    raise RuntimeError(MESSAGE)\n"},
            ("check-compile", "targets.py:fn", "--device", "cpu", "--vary", "0"),
        ),
        ({"script.py": "raise RuntimeError(MESSAGE)\n"}, ("trace-attention", "--script", "script.py")),
    ],
    ids=["check-compile", "trace-attention"],
)
def test_a_probes_target_that_raises_quoting_secrets_leaves_none_in_the_report(tmp_path, files, args):
    for name, body in files.items():
        (tmp_path / name).write_text(QUOTING + body)
    run = run_cli(tmp_path, *args, env=ENVIRONMENT)
    assert run.findings("target-raised"), run.stdout[-2000:] + run.stderr[-2000:]
    assert not _holding(run.report_dir, EVERY_SECRET)
    assert not [s for s in EVERY_SECRET if s in run.stdout]
