"""A hostile pass over the CLI: 52 damaged, crafted or odd inputs (saved reports, merge folders, cache
roots, report folders, gate configurations, and run, trace-attention, check-compile and env
arguments), each run as a child process in a scratch folder. Prints each input that gave a
traceback, an unexpected exit code, a hang, or more than one line of stderr with exit 2, then the
counts.

    python3 scripts/hostile_pass.py
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

DOCTOR = [sys.executable, "-m", "dflashdoctor"]
Case = tuple[str, list[str], tuple[int, ...]]


def _files(work: Path) -> None:
    (work / "ind").mkdir()
    (work / "tri").mkdir()
    (work / "big.json").write_text('{"schema": ' + "9" * 5000 + "}")
    (work / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    (work / "inf.json").write_text('{"schema": Infinity}')
    (work / "nul.json").write_bytes(b'{"a": "\x00"}')
    (work / "latin.json").write_bytes(b"\xff\xfe{}")
    os.mkfifo(work / "fifo.json")
    (work / "lnk.json").symlink_to("/dev/zero")
    (work / "bad.py").write_bytes(b"print('\xff')\n")
    configs = {
        "nul.toml": 'target = "a\\u0000b"\n',
        "deep.toml": "x = " + "[" * 5000 + "]" * 5000 + "\n",
        "num.toml": "timeout = 1e999\n",
        "neg.toml": "max_recompiles = -5\n",
        "huge.toml": "max_recompiles = 99999999999999999999999\n",
        "unknown.toml": "nonsense = 1\n",
        "nan.toml": "timeout = nan\n",
    }
    for name, text in configs.items():
        (work / name).write_text(text)
    (work / "bad.toml").write_bytes(b"\xff\xfe")


def _cases(work: Path) -> list[Case]:
    shown = ["big.json", "deep.json", "inf.json", "nul.json", "latin.json", "fifo.json", "lnk.json"]
    cases: list[Case] = [(f"show {n}", ["show", n], (2,)) for n in [*shown, "/dev/null", "/", "nope.json"]]
    merged = ["/", "/dev/null", str(work / "fifo.json"), str(work / "nope"), str(work / "ind")]
    cases += [(f"merge {d}", ["merge", d], (2,)) for d in merged]
    roots = ["", "\n", "bad\x1b[31m", os.fsdecode(b"\xff\xfe"), "/dev/zero", str(work / "fifo.json"), "/proc/self"]
    check = ["cache", "check", "--inductor-dir", "ind"]
    cases += [(f"cache check --triton-dir {r!r}", [*check, "--triton-dir", r, "--json"], (0, 1, 2)) for r in roots]
    folders = ["/dev/null", "/proc/self/fd", os.fsdecode(b"rep\xff"), "a" * 5000, "x/" * 2000]
    cases += [(f"--report-dir {r[:30]!r}", [*check, "--triton-dir", "tri", "--report-dir", r], (0, 2)) for r in folders]
    toml = ["nul", "deep", "num", "neg", "huge", "bad", "unknown", "nan"]
    cases += [(f"gate --config {n}.toml", ["gate", "--config", f"{n}.toml", "--json"], (2,)) for n in toml]
    cases += [
        ("gate --config /dev/zero", ["gate", "--config", "/dev/zero"], (2,)),
        ("gate --config a FIFO", ["gate", "--config", str(work / "fifo.json")], (2,)),
        ("run with no command", ["run"], (2,)),
        ("run a missing program", ["run", "--", "/nonexistent/prog"], (2,)),
        ("run --steps -1", ["run", "--steps", "-1", "--", "true"], (2,)),
        ("run --steps huge", ["run", "--steps", "9" * 40, "--", "true"], (2,)),
        ("run --hang-timeout nan", ["run", "--hang-timeout", "nan", "--", "true"], (2,)),
        ("run a file that is no program", ["run", "--", str(work / "big.json")], (2,)),
        ("run true", ["run", "--", "true"], (0,)),
        ("run false", ["run", "--", "false"], (1,)),
        ("trace-attention on a non-UTF-8 script", ["trace-attention", "--script", "bad.py"], (1, 2)),
        ("check-compile a missing module", ["check-compile", "nope.mod:fn"], (2,)),
        ("check-compile --q-len -1", ["check-compile", "x:y", "--q-len", "-1"], (2,)),
        ("check-compile --head-dim 0", ["check-compile", "x:y", "--head-dim", "0"], (2,)),
        ("env --python /bin/false", ["env", "--python", "/bin/false"], (2,)),
        ("env --python missing", ["env", "--python", "/nonexistent/python"], (2,)),
        ("an unknown command", ["frobnicate"], (2,)),
    ]
    return cases


def main() -> None:
    work = Path(tempfile.mkdtemp(prefix="hostile-"))
    try:
        _files(work)
        cases = _cases(work)
        tracebacks = wrong = 0
        for name, args, expected in cases:
            try:
                done = subprocess.run([*DOCTOR, *args], capture_output=True, timeout=120, cwd=work)
            except subprocess.TimeoutExpired:
                print(f"HANG {name}")
                wrong += 1
                continue
            err = done.stderr.decode(errors="replace").strip()
            traceback = "Traceback" in err
            tracebacks += traceback
            wrong += done.returncode not in expected
            lines = err.count("\n") + 1 if err else 0
            if traceback or done.returncode not in expected or (done.returncode == 2 and lines > 1):
                last = err.splitlines()[-1][:160] if err else ""
                print(f"{name}: exit {done.returncode}, {lines} stderr lines: {last}")
        print(f"{len(cases)} inputs, {tracebacks} tracebacks, {wrong} unexpected exit codes")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
