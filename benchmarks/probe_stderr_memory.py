"""The doctor's peak memory when a probe writes gigabytes to stderr.

The target of `check-compile` writes `--megabytes` of text to stderr as it is imported (a library
printing a warning per step, a runaway logger), then raises, so the probe ends early with a tail
to show. The doctor keeps the last few KB of the capture; before it read the whole file to take
them. Each doctor runs as a child of a small measuring process whose peak RSS of its waited-for
children (`ru_maxrss`, the doctor and the probe alike) is printed, with a baseline of a target that
writes nothing, measured in the same run.

    python3 benchmarks/probe_stderr_memory.py --megabytes 2048
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_MEASURE = (
    "import resource, subprocess, sys\n"
    "done = subprocess.run(sys.argv[1:], capture_output=True)\n"
    "print(done.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
)


def _target(folder: Path, megabytes: int) -> str:
    target = folder / f"noisy_{megabytes}.py"
    target.write_text(
        "import sys\n"
        "line = 'x' * 1023 + '\\n'\n"
        f"for _ in range({megabytes} * 1024):\n"
        "    sys.stderr.write(line)\n"
        "raise RuntimeError('done writing')\n"
        "def fn(q, k, v):\n    return q\n"
    )
    return f"{target}:fn"


def _peak(target: str, folder: Path) -> tuple[int, float, int]:
    command = [sys.executable, "-m", "dflashdoctor", "check-compile", target, "--device", "cpu"]
    command += ["--json", "--report-dir", str(folder / f"report-{time.monotonic_ns()}")]
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", _MEASURE, *command], capture_output=True, text=True, check=True)
    code, kilobytes = done.stdout.split()
    return int(code), time.perf_counter() - started, int(kilobytes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--megabytes", type=int, default=2048)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="probe-stderr-") as tmp:
        folder = Path(tmp)
        for label, megabytes in (("quiet target", 0), (f"{args.megabytes} MB to stderr", args.megabytes)):
            code, wall, kilobytes = _peak(_target(folder, megabytes), folder)
            peak = kilobytes / 1024
            print(f"{label:>22}: exit {code}, {wall:.1f} s, peak RSS of the doctor and its probe {peak:.0f} MiB")
    print(f"(this process: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB)")


if __name__ == "__main__":
    main()
