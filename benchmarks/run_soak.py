"""What a long `dflashdoctor run` leaves and costs: events per process, the doctor's memory, and the
time to write the report, against the run's length.

    python3 benchmarks/run_soak.py --steps 1000000 100000

A CPU training loop of a one-weight model (so the steps, not the model, are what is measured) runs
N optimizer steps plain, then under `run`. For each N it prints the plain and the instrumented wall
time and their ratio, the bytes of events the run wrote, the doctor's peak resident memory, and the
seconds from the command's end to the report written. Flat columns across N are the point: events
grow with time (one record per 5 s after the first 100 steps), not with steps, and so the doctor's
memory (its own peak resident set, VmHWM, sampled while it runs) and its own time (start and report:
the wall time less the command's) do not grow either.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_LOOP = """
import sys, time, torch
model = torch.nn.Linear(1, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=1e-9)
x = torch.ones(1, 1)
started = time.monotonic()
for _ in range(int(sys.argv[1])):
    optimizer.step()  # the hook `run` counts steps with; no backward: the step itself is measured
print(f"loop {time.monotonic() - started:.3f} s", flush=True)
"""
_LOOP_S = re.compile(r"loop ([\d.]+) s")


def _plain(script: Path, steps: int) -> float:
    done = subprocess.run([sys.executable, str(script), str(steps)], capture_output=True, text=True, check=True)
    return float(_LOOP_S.search(done.stdout)[1])


def _peak_rss_mib(pid: int) -> float | None:
    """The process's own peak resident memory (VmHWM): its children's are not counted."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    match = re.search(r"VmHWM:\s+(\d+) kB", status)
    return int(match[1]) / 1024 if match else None


def _under_run(script: Path, steps: int, folder: Path) -> dict[str, float]:
    command = [sys.executable, "-m", "dflashdoctor", "run", "--report-dir", str(folder), "--hang-timeout", "0"]
    command += ["--", sys.executable, str(script), str(steps)]
    started = time.monotonic()
    doctor = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    peak = 0.0
    while doctor.poll() is None:
        peak = max(peak, _peak_rss_mib(doctor.pid) or 0.0)
        time.sleep(0.1)
    wall = time.monotonic() - started
    output = doctor.stdout.read() if doctor.stdout else ""
    events = sum(p.stat().st_size for p in (folder / "events").iterdir())
    return {
        "loop_s": float(_LOOP_S.search(output)[1]),
        "events_bytes": events,
        "doctor_rss_mib": peak,
        "doctor_own_s": max(0.0, wall - json_duration(folder)),  # its start and its report, not the command's
    }


def json_duration(folder: Path) -> float:
    import json

    report = json.loads((folder / "report.json").read_text())
    return float(report["results"][0]["measurements"]["duration_s"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, nargs="+", default=[1_000_000, 100_000])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "loop.py"
        script.write_text(_LOOP)
        head = f"{'steps':>9} {'plain s':>8} {'run s':>8} {'ratio':>6} {'events MB':>10} {'doctor MiB':>11}"
        print(head + f" {'doctor s':>9}")
        for steps in args.steps:
            plain = _plain(script, steps)
            seen = _under_run(script, steps, Path(tmp) / f"run-{steps}")
            print(
                f"{steps:>9} {plain:8.2f} {seen['loop_s']:8.2f} {seen['loop_s'] / plain:6.2f} "
                f"{seen['events_bytes'] / 1e6:10.3f} {seen['doctor_rss_mib']:11.1f} {seen['doctor_own_s']:9.2f}"
            )
    print(f"(python {sys.version.split()[0]}, {os.cpu_count()} CPUs)")


if __name__ == "__main__":
    main()
