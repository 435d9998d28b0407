"""The gate's probe host (forkserver/), for real: probes forked from one interpreter that imported
torch once still fail alone (a probe killed or hung is its own `probe-crashed` section, its stacks
dumped), a host that cannot start leaves the probes to start on their own, and a doctor killed
with SIGKILL or SIGTERM takes the host and every probe it forked with it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dflashdoctor.forkserver.client import ProbeHost
from dflashdoctor.runner import probe_env
from tests.conftest import run_cli
from tests.paths import TARGETS


def _gate(tmp_path: Path, config: str) -> object:
    (tmp_path / "dflashdoctor.toml").write_text(config)
    return run_cli(tmp_path, "gate")


@pytest.mark.parametrize(
    ("fault", "timeout", "expect"),
    [("killed_by_signal", 600, "signal 9"), ("hangs", 45, "timed out")],
)
def test_a_forked_probe_killed_or_hung_is_its_own_crash_and_the_gate_goes_on(tmp_path, fault, timeout, expect):
    target = f"{TARGETS / 'bad_inputs.py'}:{fault}"
    config = f'target = "{target}"\ndevice = "cpu"\ntimeout = {timeout}\nprobes = ["env", "check-compile"]\n'
    run = _gate(tmp_path, config)
    assert run.code == 3, run.stdout[-2000:] + run.stderr[-2000:]
    sections = {r["probe"]: r for r in run.report["results"]}
    assert sections["env"]["status"] == "pass"
    crashed = sections["check-compile"]
    assert crashed["status"] == "error"
    (crash,) = [f for f in crashed["findings"] if f["code"] == "probe-crashed"]
    assert expect in crash["title"]
    if fault == "hangs":  # asked for its stacks before the kill, as a probe started alone is
        stacks = crash["evidence"]["stderr_tail"]
        assert "most recent call first" in stacks and "bad_inputs.py" in stacks
    assert run.report["environment"]["probe_host"].endswith("2 probes forked from it")


def test_a_host_that_cannot_import_torch_forks_nothing(tmp_path):
    """An interpreter without torch (a bare venv): the host says it is not ready, `start` says so
    (None), and the runner then starts each probe as its own process, which reports what is missing."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "venv")], check=True)
    python = str(tmp_path / "venv" / "bin" / "python")
    env = probe_env(python)
    host = ProbeHost.open(python, env)
    assert host is not None
    try:
        script = tmp_path / "probe.py"
        script.write_text("print('ran')\n")
        assert host.start([str(script)], env, tmp_path / "out", tmp_path / "err") is None
        assert host.describe().startswith("not used: the probe host did not start")
        assert not (tmp_path / "out").exists()
    finally:
        host.close()


def test_a_forked_probe_gets_its_environment_files_and_exit_status(tmp_path):
    host = ProbeHost.open(sys.executable, probe_env(sys.executable))
    assert host is not None
    try:
        script = tmp_path / "probe.py"
        script.write_text(
            "import os, sys, torch\n"
            "print(os.environ['PROBE_MARK'], sys.argv[1:], sys.path[0] == os.path.dirname(__file__))\n"
            "print('to stderr', file=sys.stderr)\n"
            "sys.exit(7)\n"
        )
        env = {**probe_env(sys.executable), "PROBE_MARK": "marked"}
        child = host.start([str(script), "--flag"], env, tmp_path / "out", tmp_path / "err")
        assert child is not None and child.wait(timeout=60) == 7
        assert (tmp_path / "out").read_text() == "marked ['--flag'] True\n"
        assert (tmp_path / "err").read_text() == "to stderr\n"
        assert os.getpgid(os.getpid()) != child.pid  # its own process group, which the runner kills
    finally:
        host.close()


def _children(pid: int) -> set[int]:
    """Every live descendant of `pid`, from /proc."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[0] != "Z":
                parents[int(entry.name)] = int(fields[1])
    found, frontier = set(), {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.parametrize(
    ("sig", "when"), [(signal.SIGKILL, "forked"), (signal.SIGTERM, "forked"), (signal.SIGTERM, "host")]
)
def test_the_doctor_stopped_takes_the_host_and_its_probes_with_it(tmp_path, sig, when):
    """A gate whose check-compile hangs: once the host has forked a probe (or as soon as the host
    runs, still importing: the probes are asked for after the doctor was told to stop), the doctor
    is sent `sig`; within seconds no process it started (host, forked probes) is left."""
    target = f"{TARGETS / 'bad_inputs.py'}:hangs"
    (tmp_path / "dflashdoctor.toml").write_text(
        f'target = "{target}"\ndevice = "cpu"\ntimeout = 300\nprobes = ["env", "check-compile"]\n'
    )
    mark = f"DFLASHDOCTOR_TEST_MARK={tmp_path.name}".encode()  # every process the doctor starts inherits it
    doctor = subprocess.Popen(
        [sys.executable, "-m", "dflashdoctor", "gate", "--report-dir", str(tmp_path / "report")],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "DFLASHDOCTOR_TEST_MARK": tmp_path.name},
    )
    started = time.monotonic()
    seen: set[int] = set()
    while time.monotonic() - started < 120:
        seen |= _children(doctor.pid)
        hosts = [p for p in seen if b"forkserver.server" in _cmdline(p) and _parent(p) == doctor.pid]
        probes = [p for p in _children(hosts[0]) if _comm(p).startswith("probe-")] if hosts else []
        if hosts and (when == "host" or probes):  # a forked probe, not the host's own helpers
            seen |= _children(hosts[0])
            break
        time.sleep(0.2)
    else:
        doctor.kill()
        pytest.fail("the gate never forked a probe from its host")
    doctor.send_signal(sig)
    assert doctor.wait(timeout=60) == (128 + signal.SIGTERM if sig == signal.SIGTERM else -signal.SIGKILL)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and (any(_alive(p) for p in seen) or _marked(mark)):
        time.sleep(0.2)
    assert not [p for p in seen if _alive(p)], [_cmdline(p) for p in seen if _alive(p)]
    assert not _marked(mark), [_cmdline(p) for p in _marked(mark)]  # started later, orphaned: none either


def _marked(mark: bytes) -> list[int]:
    """Live processes whose environment holds `mark`."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if (
                entry.name.isdigit()
                and mark in (entry / "environ").read_bytes().split(b"\0")
                and _alive(int(entry.name))
            ):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def _parent(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def test_undecodable_bytes_and_control_characters_reach_a_forked_probe_unchanged(tmp_path):
    """The request travels as JSON: a script folder named with a non-UTF-8 byte and an escape
    sequence, an environment value and an argument that are not UTF-8 all arrive byte for byte."""
    folder = tmp_path / os.fsdecode(b"caf\xe9\x1b[31m")
    folder.mkdir()
    script = folder / "probe.py"
    script.write_text(
        "import os, sys\nsys.stdout.buffer.write(os.fsencode(os.environ['ODD']) + b'|' + os.fsencode(sys.argv[1]))\n"
    )
    env = {**probe_env(sys.executable), "ODD": os.fsdecode(b"v\xffx")}
    host = ProbeHost.open(sys.executable, env)
    assert host is not None
    try:
        child = host.start([str(script), os.fsdecode(b"a\xfeb")], env, folder / "out", folder / "err")
        assert child is not None and child.wait(timeout=60) == 0
        assert (folder / "out").read_bytes() == b"v\xffx|a\xfeb"
    finally:
        host.close()


def _forked_output(tmp_path: Path, code: str, device: str, extra_env: dict[str, str] | None = None) -> str:
    """What `code`, run as a probe forked from a host told `device`, prints."""
    script = tmp_path / "probe.py"
    script.write_text(code)
    env = {**probe_env(sys.executable), **(extra_env or {})}
    host = ProbeHost.open(sys.executable, probe_env(sys.executable), device)
    assert host is not None
    try:
        child = host.start([str(script)], env, tmp_path / "out", tmp_path / "err")
        assert child is not None and child.wait(timeout=120) == 0, (tmp_path / "err").read_text()[-2000:]
        return (tmp_path / "out").read_text()
    finally:
        host.close()


def test_a_probe_that_sets_triton_interpret_is_forked_and_gets_the_interpreter(tmp_path):
    """READ_WHEN_USED holds: the host imported triton (with torch's Inductor) before the probe set
    TRITON_INTERPRET, and the kernel the probe then makes still runs in triton's interpreter, as
    the race's stub needs. Without the variable, the same host makes a compiled kernel."""
    pytest.importorskip("triton")
    code = (
        "import sys\nwas_imported = 'triton' in sys.modules\nimport triton\n"
        "@triton.jit\ndef kernel(x):\n    pass\n"
        "print(was_imported, type(kernel).__name__)\n"
    )
    assert _forked_output(tmp_path, code, "cpu", {"TRITON_INTERPRET": "1"}) == "True InterpretedFunction\n"
    assert _forked_output(tmp_path, code, "cpu") == "True JITFunction\n"


@pytest.mark.parametrize(("device", "cached"), [("cpu", 1), ("cuda", 0)])
def test_a_probe_forked_for_the_cpu_finds_the_vector_isa_check_done(tmp_path, device, cached):
    """Told the probes compile for the CPU, the host runs Inductor's vector-instruction check (a
    child interpreter per candidate) once, and each forked probe finds its answer cached; told
    CUDA, it leaves that to whichever probe compiles for the CPU."""
    code = (
        "from torch._inductor.cpu_vec_isa import valid_vec_isa_list\nprint(valid_vec_isa_list.cache_info().currsize)\n"
    )
    assert _forked_output(tmp_path, code, device) == f"{cached}\n"


def test_a_line_that_is_not_a_request_is_skipped_and_the_host_serves_on(tmp_path):
    """Only the doctor writes to the host; a line it did not mean (empty, not JSON, not a request)
    forks nothing and does not end the host."""
    script = tmp_path / "probe.py"
    script.write_text("print('served')\n")
    request = {"id": 0, "argv": [str(script)], "env": probe_env(sys.executable)}
    request |= {"stdout": str(tmp_path / "out"), "stderr": str(tmp_path / "err")}
    host = subprocess.Popen(
        [sys.executable, "-m", "dflashdoctor.forkserver.server", "--device", "cuda"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=probe_env(sys.executable),
    )
    try:
        assert json.loads(host.stdout.readline())["ready"] is True
        host.stdin.write(b"\nnot json\n[1]\n{}\n" + json.dumps(request).encode() + b"\n")
        host.stdin.flush()
        answer, end = json.loads(host.stdout.readline()), json.loads(host.stdout.readline())
        assert answer["id"] == 0 and end == {"pid": answer["pid"], "returncode": 0}
    finally:
        host.stdin.close()
        assert host.wait(timeout=60) == 0
    assert (tmp_path / "out").read_text() == "served\n"
