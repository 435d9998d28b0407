"""A second hostile pass over the CLI: inputs that neither scripts/hostile_pass.py nor issue 30's list
has. Numbers at the edges of every numeric option, control characters and undecodable bytes in every
option that names something, stdout parsed as JSON, files another local user (nobody, through
setpriv) placed where the doctor reads, two commands at once on one folder, and SIGTERM / SIGKILL
mid-way. Each case is a real child process in a scratch folder; printed: every input that gave a
traceback, an unexpected exit code, more than one stderr line with exit 2, a raw control character
on the terminal, stdout that is not one JSON document under --json, a hang, a file written where it
should not be (a hole), a user file lost, or a process left running; then the counts.

    python3 scripts/hostile_pass_2.py      # as root, for the other-user cases
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

DOCTOR = [sys.executable, "-m", "dflashdoctor"]
NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all", "--bounding-set=-all"]
ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Case:
    name: str
    args: list[str]
    expected: tuple[int, ...]
    json_out: bool = False  # stdout must be exactly one JSON document (or empty on exit 2)
    env: dict[str, str] = field(default_factory=dict)
    check: Callable[[Path], str] | None = None  # after the run: "" or what went wrong (a hole, a lost file)


@dataclass
class Tally:
    inputs: int = 0
    tracebacks: int = 0
    wrong_codes: int = 0
    holes: int = 0
    lost: int = 0
    left: int = 0
    other: int = 0

    def line(self) -> str:
        return (
            f"{self.inputs} inputs, {self.tracebacks} tracebacks, {self.wrong_codes} unexpected exit codes, "
            f"{self.holes} holes, {self.lost} files lost, {self.left} processes left, {self.other} other defects"
        )


def _numbers() -> list[Case]:
    cases = []
    compile_options = ["--batch", "--heads", "--kv-heads", "--q-len", "--kv-len", "--head-dim", "--vary"]
    for option in compile_options:
        for value in ("-3", "99999999999999999999"):
            cases.append(Case(f"check-compile {option} {value}", ["check-compile", "x.mod:fn", option, value], (2,)))
    cases += [
        Case("check-compile --max-recompiles -1", ["check-compile", "x.mod:fn", "--max-recompiles", "-1"], (2,)),
        Case("check-compile --timeout nan", ["check-compile", "x.mod:fn", "--timeout", "nan"], (2,)),
        Case("check-compile --timeout inf", ["check-compile", "x.mod:fn", "--timeout", "inf"], (2,)),
        Case("trace-attention --steps 0", ["trace-attention", "--steps", "0"], (2,)),
        Case("trace-attention --seq-len -1", ["trace-attention", "--seq-len", "-1"], (2,)),
        Case("trace-attention --seq-len 1e9", ["trace-attention", "--seq-len", "1e9"], (2,)),
        Case("trace-attention --timeout -5", ["trace-attention", "--timeout", "-5"], (2,)),
        Case("race --threads 0", ["race", "--threads", "0"], (2,)),
        Case("race --threads 100000", ["race", "--threads", "100000"], (2,)),
        Case("race --trials -1", ["race", "--trials", "-1"], (2,)),
        Case("race --processes -1", ["race", "--processes", "-1"], (2,)),
        Case("run --hang-timeout -1", ["run", "--hang-timeout", "-1", "--", "true"], (2,)),
        Case("run --hang-timeout inf", ["run", "--hang-timeout", "inf", "--", "true"], (0, 2)),
        Case("run --steps 0", ["run", "--steps", "0", "--", "true"], (2,)),
    ]
    return cases


_ODD = ["\x1b[31mred", "a\nb", "tab\there", "\x07bell", os.fsdecode(b"caf\xe9"), "\u202eevil"]


def _names() -> list[Case]:
    cases = []
    for text in _ODD:
        cases.append(Case(f"check-compile target {text!r}", ["check-compile", f"{text}:fn"], (2,)))
        cases.append(Case(f"trace-attention --model {text!r}", ["trace-attention", "--model", text], (2,)))
    cases += [
        Case("race --kernel escape", ["race", "--kernel", "\x1b[2J"], (2,)),
        Case("race --fix newline", ["race", "--fix", "a\nb"], (2,)),
        Case("show --format escape", ["show", "missing.json", "--format", "\x1b[31m"], (2,)),
        Case("env --python escape", ["env", "--python", "\x1b[31mpy"], (2,)),
        Case("run an escape-named program", ["run", "--", "\x1b[31mprog"], (2,)),
        Case("merge a newline-named folder", ["merge", "no\nsuch"], (2,)),
        Case("gate --target escape", ["gate", "--target", "\x1b]0;t\x07:fn"], (2,)),
        Case("gate --run unclosed quote", ["gate", "--run", "python 'x"], (2,)),
        Case("trace-attention --expect-wrapper no colon", ["trace-attention", "--expect-wrapper", "\x1bnocolon"], (2,)),
    ]
    return cases


_ROOTS = ["--triton-dir", "tri", "--inductor-dir", "ind"]


def _json_cases(work: Path) -> list[Case]:
    noisy = work / "noisy.py"
    noisy.write_text("print('not json'); print('{\"verdict\": \"pass\"}')\n")
    return [
        Case("run --json of a program that prints", ["run", "--json", "--", sys.executable, str(noisy)], (0,), True),
        Case("run --json of false", ["run", "--json", "--", "false"], (1,), True),
        Case(
            "cache check --json",
            ["cache", "check", "--json", "--triton-dir", "tri", "--inductor-dir", "ind"],
            (0, 1),
            True,
        ),
        Case("check-compile --json of a missing module", ["check-compile", "nope.mod:fn", "--json"], (2,), True),
        Case("merge --json of no folder", ["merge", "nothere", "--json"], (2,), True),
        Case("gate --json with a bad --run", ["gate", "--json", "--run", "/nonexistent/x"], (2,), True),
        Case("race --json --threads 0", ["race", "--json", "--threads", "0"], (2,), True),
        Case("show --format json of a damaged file", ["show", "noisy.py", "--format", "json"], (2,), True),
    ]


def _other_user(work: Path) -> list[Case]:
    """Files nobody placed in a world-writable folder root works in."""
    work.chmod(0o711)  # nobody may pass through the scratch folder to the shared one
    shared = work / "shared"
    shared.mkdir(mode=0o1777)
    shared.chmod(0o1777)
    secret = work / "root-only"
    secret.write_text("root's")
    secret.chmod(0o600)
    script = (
        f"cd {shared}; mkdir -p tri ind; ln -s {secret} junit.xml; ln -s {secret} report.sarif; "
        f"mkdir nobody-reports; ln -s {secret} nobody-reports/report.json; "
        "printf 'schema = 1\\n' > planted.toml"
    )
    subprocess.run([*NOBODY, "sh", "-ec", script], check=True)

    def secret_intact(_work: Path) -> str:
        return "" if secret.read_text() == "root's" else "root-only file overwritten through nobody's link"

    return [
        Case(
            "cache check --junit onto nobody's link",
            ["cache", "check", "--triton-dir", str(shared / "tri"), "--inductor-dir", str(shared / "ind"), "--json"],
            (0, 1, 2),
            check=secret_intact,
        ),
        Case(
            "gate --junit onto nobody's link",
            ["gate", "--config", str(shared / "planted.toml"), "--junit", str(shared / "junit.xml")],
            (2,),
            check=secret_intact,
        ),
        Case(
            "gate --sarif onto nobody's link",
            ["gate", "--config", str(shared / "planted.toml"), "--sarif", str(shared / "report.sarif")],
            (2,),
            check=secret_intact,
        ),
        Case(
            "--report-dir nobody's folder with a planted link",
            [
                "cache",
                "check",
                "--triton-dir",
                "tri",
                "--inductor-dir",
                "ind",
                "--report-dir",
                str(shared / "nobody-reports"),
            ],
            (2,),
            check=secret_intact,
        ),
        Case("show a report through nobody's link", ["show", str(shared / "nobody-reports" / "report.json")], (2,)),
        Case("merge nobody's folder", ["merge", str(shared / "nobody-reports")], (2,)),
    ]


def _run_case(case: Case, work: Path, tally: Tally) -> None:
    tally.inputs += 1
    env = {**os.environ, **case.env}
    try:
        done = subprocess.run([*DOCTOR, *case.args], capture_output=True, timeout=180, cwd=work, env=env)
    except subprocess.TimeoutExpired:
        print(f"HANG {case.name}")
        tally.other += 1
        return
    err = done.stderr.decode(errors="replace")
    problems = []
    if "Traceback" in err:
        tally.tracebacks += 1
        problems.append("traceback")
    if done.returncode not in case.expected:
        tally.wrong_codes += 1
        problems.append(f"exit {done.returncode}, expected {case.expected}")
    if done.returncode == 2 and len(err.strip().splitlines()) > 1:
        tally.other += 1
        problems.append(f"{len(err.strip().splitlines())} stderr lines")
    if any(ch in err for ch in ("\x1b", "\x07", "\u202e")):
        tally.other += 1
        problems.append("a raw control character on the terminal")
    if case.json_out:
        out = done.stdout.decode(errors="replace")
        if done.returncode == 2:
            if out.strip():
                tally.other += 1
                problems.append("stdout not empty on exit 2")
        else:
            try:
                json.loads(out)
            except ValueError:
                tally.other += 1
                problems.append(f"stdout is not one JSON document: {out[:80]!r}")
    if case.check is not None:
        said = case.check(work)
        if said:
            tally.holes += 1
            problems.append(said)
    if problems:
        last = err.strip().splitlines()[-1][:160] if err.strip() else ""
        print(f"{case.name}: {'; '.join(problems)} [{last!r}]")


def _descendants_alive(marker: str) -> list[int]:
    alive = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as handle:
                    if marker.encode() in handle.read():
                        alive.append(int(entry))
            except OSError:
                continue
    return alive


def _signals(work: Path, tally: Tally) -> None:
    """SIGTERM and SIGKILL to `run` and `gate` mid-way: no half report read as whole, what is left."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for command in ("run", "gate"):
            tally.inputs += 1
            marker = f"hostile-sleeper-{command}-{sig.name}"
            program = [sys.executable, "-c", f"import time, sys; sys.argv.append({marker!r}); time.sleep(60)"]
            folder = work / f"sig-{command}-{sig.name}"
            if command == "run":
                argv = [*DOCTOR, "run", "--report-dir", str(folder), "--", *program, marker]
            else:
                (work / f"{marker}.toml").write_text(f'probes = ["env"]\nrun = {json.dumps([*program, marker])}\n')
                argv = [*DOCTOR, "gate", "--config", f"{marker}.toml", "--report-dir", str(folder)]
            doctor = subprocess.Popen(argv, cwd=work, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            deadline = time.monotonic() + 90
            while not _descendants_alive(marker) and time.monotonic() < deadline:
                time.sleep(0.2)
            time.sleep(1)
            doctor.send_signal(sig)
            _, err = doctor.communicate(timeout=120)
            time.sleep(3)
            left = _descendants_alive(marker)
            report = folder / "report.json"
            problems = []
            if b"Traceback" in err and b"dflashdoctor" in err.split(b"Traceback", 1)[1]:
                tally.tracebacks += 1  # the program's own KeyboardInterrupt (run forwards Ctrl-C) is not ours
                problems.append("traceback")
            if report.exists():
                try:
                    json.loads(report.read_text())
                except ValueError:
                    tally.other += 1
                    problems.append("a half-written report.json")
            if left:
                tally.left += len(left)
                problems.append(f"{len(left)} processes still running: {left}")
                for pid in left:
                    os.kill(pid, signal.SIGKILL)
            if sig == signal.SIGTERM and not report.exists() and command == "run":
                tally.other += 1
                problems.append("no report after SIGTERM")
            print(f"{sig.name} to {command} mid-way: exit {doctor.returncode}; " + ("; ".join(problems) or "clean"))


def _two_at_once(work: Path, tally: Tally) -> None:
    """Two runs into one --report-dir at once: one refused or both whole; never a mixed report."""
    tally.inputs += 1
    folder = work / "shared-run"
    argv = [*DOCTOR, "run", "--report-dir", str(folder), "--", sys.executable, "-c", "import time; time.sleep(2)"]
    both = [subprocess.Popen(argv, cwd=work, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for _ in range(2)]
    codes = []
    for proc in both:
        _, err = proc.communicate(timeout=120)
        codes.append(proc.returncode)
        if b"Traceback" in err:
            tally.tracebacks += 1
    whole = (folder / "report.json").exists() and json.loads((folder / "report.json").read_text())["command"] == "run"
    ok = sorted(codes) == [0, 2] and whole  # both 0: both ran into one events folder, one mixed report
    tally.wrong_codes += not ok
    print(f"two runs into one --report-dir: exits {codes}, report whole: {whole}" + ("" if ok else "  <- defect"))


def main() -> None:
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        raise SystemExit("run as root with setpriv: the other-user cases need both")
    work = Path(tempfile.mkdtemp(prefix="hostile2-"))
    tally = Tally()
    try:
        (work / "tri").mkdir()
        (work / "ind").mkdir()
        mine = work / "mine.txt"
        mine.write_text("the user's")
        cases = [*_numbers(), *_names(), *_json_cases(work), *_other_user(work)]
        for case in cases:
            _run_case(case, work, tally)
        _two_at_once(work, tally)
        _signals(work, tally)
        if mine.read_text() != "the user's":
            tally.lost += 1
        print(tally.line())
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
