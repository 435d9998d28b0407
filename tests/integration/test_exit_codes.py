"""The exit-code contract as a table: hostile inputs across all seven commands, each with the exit code
it must give (0 pass, 1 findings, 2 bad input, 3 probe crashed), and for every row: no traceback of
dflashdoctor's own, with --json one JSON document on stdout (or nothing, for bad input), a report
where one is promised, bad input as one line. A row runs the CLI in this process (conftest's
run_main_here: the probes and programs it starts are still child processes); the rows marked `child`
run it as a user does, a real `python -m dflashdoctor`, for what only a real process shows (its
exit status, and bytes a program or a file name puts through its pipes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests import cache_tree
from tests.conftest import run_main_here
from tests.paths import TARGETS
from tests.unit.test_renderers import rendered_markdown

COMMANDS = ("check-compile", "trace-attention", "race", "run", "gate", "env", "cache")
VERDICT = {0: "pass", 1: "fail", 3: "error"}


@dataclass(frozen=True)
class Case:
    id: str
    argv: tuple[str, ...]  # `{w}`: the workspace of hostile files below; `{t}`: tests/targets
    code: int
    env: dict[str, str] = field(default_factory=dict)
    child_output: bool = False  # the command under `run` prints its own traceback
    also: Callable[[subprocess.CompletedProcess[str], Path], None] | None = None
    child: bool = False  # run as a real `python -m dflashdoctor`, not in this process


def _no_secret(done: subprocess.CompletedProcess[str], report: Path) -> None:
    assert "hunter2" not in done.stdout and "hunter2" not in (report / "report.json").read_text()
    assert "https://<redacted>@hf.example/" in done.stdout


def _one_json_document(done: subprocess.CompletedProcess[str], report: Path) -> None:
    json.loads(done.stdout)  # nothing but the report: the command's own "x" went to stderr
    assert done.stderr.splitlines()[0] == "x"


def _safe_outputs(done: subprocess.CompletedProcess[str], report: Path) -> None:
    """Whatever the message held, every file is valid for its format and no raw control character or
    markup got through."""
    from xml.etree import ElementTree as ET

    ET.parse(report / "junit.xml")
    json.loads((report / "report.sarif").read_text(encoding="utf-8"))
    html = (report / "report.html").read_text(encoding="utf-8")
    markdown = rendered_markdown((report / "report.md").read_text(encoding="utf-8"))
    assert "<script>" not in html and "<script>" not in markdown
    assert "\x1b" not in done.stderr + html + markdown and "\x00" not in html + markdown


def _blames_the_target(done: subprocess.CompletedProcess[str], report: Path) -> None:
    codes = {f["code"] for r in json.loads(done.stdout)["results"] for f in r["findings"]}
    assert "target-raised" in codes and "autotuner-race" not in codes, codes


def _short_line(done: subprocess.CompletedProcess[str], report: Path) -> None:
    """transformers lists every model type it knows in its message: the line stays readable."""
    assert len(done.stderr) < 400, len(done.stderr)


def _hang_finding(done: subprocess.CompletedProcess[str], report: Path) -> None:
    codes = {f["code"] for r in json.loads(done.stdout)["results"] for f in r["findings"]}
    assert "hang" in codes, codes


def _shown_escaped(done: subprocess.CompletedProcess[str], report: Path) -> None:
    """The undecodable byte of the folder name, as `ls -b` shows it."""
    assert "/lat\\xe9n/triton" in json.loads(done.stdout)["environment"]["target"]


BAD = 2
CASES = [
    # check-compile: options, targets, shapes
    Case("cc-device", ("check-compile", "--device", "tpu"), BAD),
    Case("cc-mask", ("check-compile", "--mask", "diagonal"), BAD),
    Case("cc-dtype", ("check-compile", "--dtype", "int8"), BAD),
    Case("cc-no-colon", ("check-compile", "nocolon"), BAD),
    Case("cc-no-module", ("check-compile", "no.such.module:fn"), BAD),
    Case("cc-no-file", ("check-compile", "{w}/missing.py:fn"), BAD),
    Case("cc-syntax", ("check-compile", "{t}/syntax_error.py:fn"), BAD),
    Case("cc-getattr-raises", ("check-compile", "{w}/getattr_raises.py:fn"), BAD),
    Case("cc-import-raises", ("check-compile", "{w}/import_raises.py:fn"), BAD),
    Case("cc-not-callable", ("check-compile", "{w}/not_callable.py:X"), BAD),
    Case("cc-wrong-signature", ("check-compile", "{w}/wrong_signature.py:fn"), BAD),
    Case("cc-batch-0", ("check-compile", "--batch", "0"), BAD),
    Case("cc-batch-negative", ("check-compile", "--batch", "-1"), BAD),
    Case("cc-batch-huge", ("check-compile", "--batch", str(10**20)), BAD),
    Case("cc-batch-word", ("check-compile", "--batch", "x"), BAD),
    Case("cc-heads-gqa", ("check-compile", "--heads", "8", "--kv-heads", "3"), BAD),
    Case("cc-head-dim", ("check-compile", "--head-dim", "8"), BAD),
    Case("cc-dflash-kv", ("check-compile", "--kv-len", "100", "--q-len", "256"), BAD),
    Case("cc-dflash-blocks", ("check-compile", "--q-len", "250", "--kv-len", "1280"), BAD),
    Case("cc-vary-negative", ("check-compile", "--vary", "-1"), BAD),
    Case("cc-vary-huge", ("check-compile", "--vary", "100000"), BAD),
    Case("cc-max-recompiles", ("check-compile", "--max-recompiles", "-3"), BAD),
    Case("cc-timeout-0", ("check-compile", "--timeout", "0"), BAD),
    Case("cc-timeout-nan", ("check-compile", "--timeout", "nan"), BAD),
    Case("cc-timeout-inf", ("check-compile", "--timeout", "inf"), BAD),
    Case("cc-timeout-word", ("check-compile", "--timeout", "soon"), BAD),
    Case("cc-python-missing", ("check-compile", "--python", "/no/such/python3"), BAD),
    Case("cc-python-without-torch", ("check-compile", "--python", "{w}/venv/bin/python"), BAD),
    Case("cc-ssh-spec", ("check-compile", "--ssh", "-oProxyCommand=x"), BAD),
    Case("cc-unknown-option", ("check-compile", "--frobnicate"), BAD, child=True),
    Case("cc-report-dir-file", ("check-compile", "--report-dir", "{w}/a_file"), BAD),
    Case("cc-report-dir-under-file", ("check-compile", "--report-dir", "{w}/a_file/below"), BAD),
    Case(
        "cc-inputs-do-not-fit",
        ("check-compile", "--device", "cpu", "--q-len", "1000000", "--kv-len", "2000000", "--vary", "0"),
        BAD,
    ),
    Case("cc-target-raises", ("check-compile", "{w}/raises.py:fn", "--device", "cpu", "--vary", "0"), 1),
    Case(
        "cc-memory-error-without-message",
        ("check-compile", "{w}/memory_error.py:fn", "--device", "cpu", "--vary", "0"),
        1,
    ),
    Case(
        "cc-message-with-controls-and-markup",
        ("check-compile", "{w}/raises_hostile.py:fn", "--device", "cpu", "--vary", "0"),
        1,
        also=_safe_outputs,
    ),
    Case(
        "cc-message-with-lone-surrogate",
        ("check-compile", "{w}/raises_surrogate.py:fn", "--device", "cpu", "--vary", "0"),
        1,
        also=_safe_outputs,
    ),
    # trace-attention
    Case("ta-device", ("trace-attention", "--device", "tpu"), BAD),
    Case("ta-scale", ("trace-attention", "--scale", "huge"), BAD),
    Case("ta-steps-0", ("trace-attention", "--steps", "0"), BAD),
    Case("ta-steps-huge", ("trace-attention", "--steps", str(10**9)), BAD),
    Case("ta-seq-len-0", ("trace-attention", "--seq-len", "0"), BAD),
    Case("ta-seq-len-huge", ("trace-attention", "--seq-len", str(10**20)), BAD),
    Case("ta-fault-unknown", ("trace-attention", "--drafter", "--drafter-fault", "boom"), BAD),
    Case("ta-fault-without-drafter", ("trace-attention", "--drafter-fault", "eager-wrapper"), BAD),
    Case("ta-script-missing", ("trace-attention", "--script", "{w}/missing.py"), BAD),
    Case("ta-expect-no-colon", ("trace-attention", "--drafter", "--expect-wrapper", "nocolon"), BAD),
    Case("ta-expect-no-module", ("trace-attention", "--drafter", "--expect-wrapper", "no.such.mod:attr"), BAD),
    Case("ta-expect-unbound", ("trace-attention", "--drafter", "--expect-wrapper", "{w}/wrapper.py:missing"), BAD),
    Case("ta-model-unknown", ("trace-attention", "--model", "nosuchpreset"), BAD),
    Case("ta-model-not-json", ("trace-attention", "--model", "{w}/not_json.json"), BAD),
    Case("ta-model-unknown-type", ("trace-attention", "--model", "{w}/unknown_type.json"), BAD, also=_short_line),
    Case("ta-timeout-negative", ("trace-attention", "--timeout", "-5"), BAD),
    Case("ta-script-raises", ("trace-attention", "--script", "{w}/script_raises.py"), 1),
    # race
    Case("race-threads-1", ("race", "--threads", "1"), BAD),
    Case("race-threads-huge", ("race", "--threads", "100000"), BAD),
    Case("race-kernel-unknown", ("race", "--kernel", "warp-drive"), BAD),
    Case("race-fix-unknown", ("race", "--fix", "maybe"), BAD),
    Case("race-trials-negative", ("race", "--trials", "-1"), BAD),
    Case("race-trials-huge", ("race", "--trials", "100000"), BAD),
    Case("race-processes-1", ("race", "--processes", "1"), BAD),
    Case("race-binaries-file", ("race", "--kernel", "fla", "--triton-binaries", "{w}/a_file"), BAD),
    Case("race-binaries-stub", ("race", "--triton-binaries", "{w}/bins"), BAD),
    Case("race-target-missing", ("race", "--kernel", "{w}/missing.py:fn"), BAD),
    Case(
        "race-target-raises-outside-triton",
        ("race", "--kernel", "{w}/race_raises.py:fn", "--trials", "1"),
        1,
        also=_blames_the_target,
    ),
    # run
    Case("run-without-dashes", ("run",), BAD),
    Case("run-nothing", ("run", "--"), BAD),
    Case("run-not-found", ("run", "--", "/no/such/program"), BAD),
    Case("run-not-a-program", ("run", "--", "{w}/not_a_program"), BAD),
    Case("run-steps-0", ("run", "--steps", "0", "--", sys.executable, "-c", "pass"), BAD),
    Case("run-hang-timeout-nan", ("run", "--hang-timeout", "nan", "--", sys.executable, "-c", "pass"), BAD),
    Case("run-hang-timeout-inf", ("run", "--hang-timeout", "inf", "--", sys.executable, "-c", "pass"), BAD),
    Case("run-report-dir-file", ("run", "--report-dir", "{w}/a_file", "--", sys.executable, "-c", "pass"), BAD),
    Case("run-json-stdout", ("run", "--", sys.executable, "-c", "print('x')"), 0, also=_one_json_document, child=True),
    Case("run-child-exits-3", ("run", "--", sys.executable, "-c", "raise SystemExit(3)"), 1),
    Case(
        "run-child-raises-surrogate",
        ("run", "--", sys.executable, "-c", "raise ValueError('bad \\udcff name')"),
        1,
        child_output=True,
        child=True,
    ),
    Case(
        "run-child-killed",
        ("run", "--", sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"),
        1,
    ),
    Case("run-hang-not-python", ("run", "--hang-timeout", "2", "--", "sleep", "60"), 1, also=_hang_finding),
    Case(
        "run-hang-in-a-shell", ("run", "--hang-timeout", "2", "--", "bash", "-c", "sleep 1000"), 1, also=_hang_finding
    ),
    # gate: configuration and overrides
    Case("gate-config-missing", ("gate", "--config", "{w}/missing.toml"), BAD, child=True),
    Case("gate-config-not-utf8", ("gate", "--config", "{w}/not_utf8.toml"), BAD),
    Case("gate-config-not-toml", ("gate", "--config", "{w}/not_toml.toml"), BAD),
    Case("gate-timeout-nan", ("gate", "--config", "{w}/timeout_nan.toml"), BAD),
    Case("gate-timeout-inf", ("gate", "--config", "{w}/timeout_inf.toml"), BAD),
    Case("gate-budget-nan", ("gate", "--config", "{w}/budget_nan.toml"), BAD),
    Case("gate-budget-negative", ("gate", "--config", "{w}/budget_negative.toml"), BAD),
    Case("gate-recompiles-negative", ("gate", "--config", "{w}/recompiles_negative.toml"), BAD),
    Case("gate-vary-huge", ("gate", "--config", "{w}/vary_huge.toml"), BAD),
    Case("gate-unknown-key", ("gate", "--config", "{w}/unknown_key.toml"), BAD),
    Case("gate-wrong-type", ("gate", "--config", "{w}/wrong_type.toml"), BAD),
    Case("gate-empty-probes", ("gate", "--config", "{w}/empty_probes.toml"), BAD),
    Case("gate-target-no-colon", ("gate", "--config", "{w}/target_no_colon.toml"), BAD),
    Case("gate-device-override", ("gate", "--config", "{w}/env_only.toml", "--device", "tpu"), BAD),
    Case("gate-target-override", ("gate", "--config", "{w}/env_only.toml", "--target", "nocolon"), BAD),
    Case("gate-junit-under-file", ("gate", "--config", "{w}/env_only.toml", "--junit", "{w}/a_file/x.xml"), BAD),
    Case("gate-sarif-folder", ("gate", "--config", "{w}/env_only.toml", "--sarif", "{w}"), BAD),
    Case("gate-env-only", ("gate", "--config", "{w}/env_only.toml"), 0),
    # env
    Case("env-python-missing", ("env", "--python", "/no/such/python3"), BAD, child=True),
    Case("env-python-without-torch", ("env", "--python", "{w}/venv/bin/python"), BAD),
    Case("env-ssh-port", ("env", "--ssh", "host:99999"), BAD),
    Case("env-ssh-trailing-newline", ("env", "--ssh", "host\n"), BAD),  # `$` matched before a final newline
    Case("env-ssh-unicode-port", ("env", "--ssh", "host:\u0663"), BAD),
    Case(
        "env-url-credentials",
        ("env",),
        0,
        env={"HF_ENDPOINT": "https://user:hunter2@hf.example/?token=hunter2"},
        also=_no_secret,
    ),
    # cache
    Case("cache-unknown-action", ("cache", "frobnicate"), BAD),
    Case("cache-root-missing", ("cache", "check", "--triton-dir", "{w}/missing"), BAD),
    Case("cache-root-file", ("cache", "check", "--triton-dir", "{w}/a_file"), BAD),
    Case("cache-wait-nan", ("cache", "fix", "--triton-dir", "{w}/triton", "--wait", "nan"), BAD),
    Case("cache-restore-not-a-quarantine", ("cache", "restore", "{w}"), BAD),
    Case("cache-report-dir-file", ("cache", "check", "--triton-dir", "{w}/triton", "--report-dir", "{w}/a_file"), BAD),
    Case(
        "cache-non-utf8-root",
        ("cache", "check", "--triton-dir", "{w}/lat\udce9n/triton"),
        1,
        also=_shown_escaped,
        child=True,
    ),
    Case("cache-healthy", ("cache", "check", "--triton-dir", "{w}/triton"), 0),
    # the CLI itself
    Case("cli-unknown-command", ("frobnicate",), BAD, child=True),
    Case("cli-version", ("--version",), 0, child=True),
]


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every hostile file the table names, made once."""
    w = tmp_path_factory.mktemp("hostile")
    (w / "a_file").write_text("not a folder\n")
    signature = "def fn(query, key, value, block_mask=None, enable_gqa=False):\n"
    _write(w / "raises.py", signature + "    raise ValueError('the target is broken')\n")
    _write(w / "memory_error.py", signature + "    raise MemoryError()\n")
    hostile = "\\x1b[31mred\\x07 \\x00 <script>alert(1)</script> `tick` |pipe| \\ufffe"
    _write(w / "raises_hostile.py", signature + f"    raise RuntimeError('{hostile}')\n")
    _write(w / "raises_surrogate.py", signature + "    raise ValueError('bad \\udcff name')\n")
    _write(w / "getattr_raises.py", "def __getattr__(name):\n    raise ValueError('no lookups here')\n")
    _write(w / "import_raises.py", "raise RuntimeError('this module cannot be imported')\n")
    _write(w / "not_callable.py", "X = 5\n")
    _write(w / "wrong_signature.py", "def fn(only_one):\n    return only_one\n")
    _write(w / "wrapper.py", "compiled = None\n")
    _write(w / "script_raises.py", "raise RuntimeError('the script is broken')\n")
    _write(w / "race_raises.py", "def fn(worker, device):\n    raise ValueError('the workload is broken')\n")
    _write(w / "not_a_program", "no shebang, not executable\n")
    os.chmod(w / "not_a_program", 0o755)
    _write(w / "not_json.json", "{not json")
    _write(w / "unknown_type.json", json.dumps({"model_type": "frobnicator"}))
    (w / "not_utf8.toml").write_bytes(b'target = "\xff"\n')
    configs = {
        "not_toml": "max_recompiles = [\n",
        "timeout_nan": "timeout = nan\n",
        "timeout_inf": "timeout = inf\n",
        "budget_nan": "max_compile_seconds = nan\n",
        "budget_negative": "max_compile_seconds = -1.0\n",
        "recompiles_negative": "max_recompiles = -1\n",
        "vary_huge": "vary = 100000000000\n",
        "unknown_key": "max_recompile = 3\n",
        "wrong_type": 'vary = "ten"\n',
        "empty_probes": "probes = []\n",
        "target_no_colon": 'target = "nocolon"\n',
        "env_only": 'probes = ["env"]\n',
    }
    for name, text in configs.items():
        _write(w / f"{name}.toml", text)
    cache_tree.healthy_tree(w / "triton", 3)
    broken = cache_tree.healthy_tree(Path(os.fsdecode(bytes(w) + b"/lat\xe9n/triton")), 2)
    cache_tree.truncate_binary(broken[0])
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(w / "venv")], check=True)
    return w


def _command_words(argv: list[str]) -> int:
    if not argv or argv[0] not in COMMANDS:
        return 0
    return 2 if argv[0] == "cache" else 1


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_exit_code_contract(case: Case, workspace: Path, tmp_path: Path) -> None:
    argv = [a.format(w=workspace, t=TARGETS) for a in case.argv]
    words = _command_words(argv)
    report = tmp_path / "report"
    ours = [] if not words else [*(["--report-dir", str(report)] if "--report-dir" not in argv else []), "--json"]
    argv = [*argv[:words], *ours, *argv[words:]]
    env = {"TRITON_CACHE_DIR": str(tmp_path / "tc"), **case.env}
    if case.child:
        done = subprocess.run(
            [sys.executable, "-m", "dflashdoctor", *argv],
            capture_output=True,
            text=True,
            errors="backslashreplace",
            timeout=600,
            cwd=tmp_path,
            env={**os.environ, **env},
        )
    else:
        done = run_main_here(tmp_path, argv, env, errors="backslashreplace")
    assert done.returncode == case.code, f"stdout: {done.stdout[-2000:]}\nstderr: {done.stderr[-2000:]}"
    if not case.child_output:
        assert "Traceback (most recent call last)" not in done.stderr, done.stderr[-3000:]
    if case.code == BAD:
        assert done.stdout == "", done.stdout[-2000:]
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("dflashdoctor: "), done.stderr
    elif words:
        document = json.loads(done.stdout)  # exactly one JSON document on stdout
        assert document["verdict"] == VERDICT[case.code]
        assert json.loads((report / "report.json").read_text(encoding="utf-8"))["verdict"] == document["verdict"]
    if case.also is not None:
        case.also(done, report)


def test_the_table_is_large_enough():
    assert len(CASES) >= 80
    assert {c.argv[0] for c in CASES} >= set(COMMANDS)
    assert {c.code for c in CASES if c.child} == {0, 1, BAD}  # each kind of ending, from a real process too


def _started(argv: list[str], cwd: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "dflashdoctor", *argv],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_for(condition: Callable[[], bool], timeout_s: float = 120.0) -> None:
    import time

    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def test_a_run_stopped_by_sigterm_exits_3_with_its_report(tmp_path):
    """A CI runner cancelling the job: the run did not end on its own, so no verdict (exit 3), and the
    report of what was seen is written."""
    import signal

    report = tmp_path / "report"
    child = _started(
        ["run", "--report-dir", str(report), "--", sys.executable, "-c", "import time; time.sleep(300)"], tmp_path
    )
    _wait_for(lambda: any((report / "events").glob("*.jsonl")))  # the command runs: not only the claim
    child.send_signal(signal.SIGTERM)
    _out, err = child.communicate(timeout=120)
    assert child.returncode == 3, err[-2000:]
    document = json.loads((report / "report.json").read_text())
    assert document["verdict"] == "error"
    assert "run-interrupted" in {f["code"] for r in document["results"] for f in r["findings"]}


def test_a_probe_stopped_by_sigterm_goes_with_the_doctor(tmp_path):
    """SIGTERM while check-compile's probe runs: one line, exit 143, and the probe's process is gone."""
    import signal

    child = _started(["check-compile", "--report-dir", str(tmp_path / "report")], tmp_path)
    probe = tmp_path / "probe-pid"
    _wait_for(lambda: _probe_pids(child.pid) != [])
    probe.write_text(" ".join(map(str, _probe_pids(child.pid))))
    child.send_signal(signal.SIGTERM)
    _out, err = child.communicate(timeout=120)
    assert child.returncode == 143 and err.strip() == "dflashdoctor: stopped by SIGTERM"
    for pid in map(int, probe.read_text().split()):
        _wait_for(lambda pid=pid: not Path(f"/proc/{pid}").exists() or _zombie(pid), timeout_s=30)


def test_a_probe_outlives_no_doctor_killed_with_sigkill(tmp_path):
    """SIGKILL leaves the doctor no say; the probe notices its parent is gone and kills itself and
    its process group (probe_support): nothing of the command is left running."""
    import signal

    hangs = f"{TARGETS / 'bad_inputs.py'}:hangs"  # the probe would run to its 600 s timeout
    child = _started(["check-compile", hangs, "--timeout", "600", "--report-dir", str(tmp_path / "report")], tmp_path)
    _wait_for(lambda: _probe_pids(child.pid) != [])
    probes = _probe_pids(child.pid)
    child.send_signal(signal.SIGKILL)
    child.communicate(timeout=60)
    for pid in probes:
        _wait_for(lambda pid=pid: not Path(f"/proc/{pid}").exists() or _zombie(pid), timeout_s=30)


def _parent(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def _probe_pids(ancestor: int) -> list[int]:
    """check-compile probe processes started by `ancestor` (their argv names the probe script): not
    those of another test run on the same machine."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if not any(part.endswith(b"probes/check_compile.py") for part in argv):
                continue
            pid = int(entry.name)
            while pid not in (ancestor, 0, 1) and pid is not None:
                pid = _parent(pid)
            if pid == ancestor:
                pids.append(int(entry.name))
    return pids


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1].startswith("Z")
    except OSError:
        return True


def test_two_runs_in_the_same_second_keep_two_reports(tmp_path):
    cache_tree.healthy_tree(tmp_path / "triton", 2)
    argv = ["cache", "check", "--triton-dir", str(tmp_path / "triton")]
    children = [_started(argv, tmp_path) for _ in range(3)]
    assert [child.wait(timeout=120) for child in children] == [0, 0, 0]
    folders = sorted((tmp_path / "reports").iterdir())
    assert len(folders) == 3 and all((folder / "report.json").is_file() for folder in folders), folders


def test_an_unwritable_report_folder_is_refused_before_probing(tmp_path):
    """As a user without root's override: a read-only folder for the report is one line, exit 2, and no
    probe ran (it would take seconds; this takes well under one)."""
    from tests.conftest import permissions_apply

    prefix = permissions_apply(tmp_path)
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o555)
    done = subprocess.run(
        [*prefix, sys.executable, "-m", "dflashdoctor", "check-compile", "--report-dir", str(locked / "r")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and done.stdout == ""
    assert (
        done.stderr.strip()
        == f"dflashdoctor: Invalid value for '--report-dir': {locked} cannot be written by this user"
    )
