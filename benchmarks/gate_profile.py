"""Where a warm gate's wall time goes: every process of it on one clock, and (with --profile) each
one's cProfile.

The gate is a tree of processes (the doctor, the probe host, the probes it forks, the compile
workers and helpers they start), so neither a section's duration nor one process's profile says
what its critical path is. This script puts a `sitecustomize` on the path of every Python process
the gate starts: each records when it started (or was forked) and when it ended, on the system-wide
monotonic clock, and in profile mode runs cProfile on its main thread until it ends (also through
`os._exit`, as the probes end). Diagnosis only: the gate itself is unchanged, and the timings under
--profile are inflated by the profiler (times without it come first). The hook stands in for any
sitecustomize of the interpreter's own (an image's apport hook, on the H200: 0.04 s of start-up).

    python3 benchmarks/gate_profile.py --out DIR [--repeats 2] [--profile] [--package DIR]

Prints, for the last timed warm gate, each process's start and end in seconds from the gate's
start, and the probes' own phase times from the report; with --profile, each probe's and the
doctor's costliest functions (cumulative), with the .prof files kept in DIR.
"""

from __future__ import annotations

import argparse
import json
import os
import pstats
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Runs in every Python process started with GATE_PROFILE_DIR set, as Python starts up.
SITECUSTOMIZE = r"""
import os, time
_DIR = os.environ.get("GATE_PROFILE_DIR")
if _DIR:
    import atexit, json, sys
    _STATE = {}

    def _arm(kind):
        _STATE.update(kind=kind, started=time.perf_counter(), pid=os.getpid(), done=False, prof=None)
        if os.environ.get("GATE_PROFILE_MODE") == "profile":
            import cProfile
            _STATE["prof"] = cProfile.Profile()
            _STATE["prof"].enable()

    def _record():
        if _STATE.get("done") or _STATE.get("pid") != os.getpid():
            return
        _STATE["done"] = True
        ended = time.perf_counter()
        try:
            comm = open("/proc/self/comm").read().strip()
        except OSError:
            comm = "?"
        name = f"{_DIR}/{os.getpid()}-{_STATE['kind']}"
        if _STATE["prof"] is not None:
            _STATE["prof"].disable()
            _STATE["prof"].dump_stats(name + ".prof")
        with open(name + ".json", "w") as handle:
            json.dump({"pid": os.getpid(), "ppid": os.getppid(), "kind": _STATE["kind"], "comm": comm,
                       "argv": sys.argv[:4], "started": _STATE["started"], "ended": ended}, handle)

    _real_exit = os._exit

    def _exit(code):
        _record()
        _real_exit(code)

    os._exit = _exit
    atexit.register(_record)
    _arm("exec")
    os.register_at_fork(after_in_child=lambda: _arm("fork"))
"""


def _gate(work: Path, cache: Path, report: Path, hook: Path | None, mode: str, package: Path) -> tuple[float, float]:
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(cache / "inductor"), TRITON_CACHE_DIR=str(cache / "triton"))
    env.pop("GATE_PROFILE_DIR", None)
    paths = [str(package)] + ([str(hook.parent)] if hook else []) + [env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(filter(None, paths))
    if hook:
        env.update(GATE_PROFILE_DIR=str(hook), GATE_PROFILE_MODE=mode)
    argv = [sys.executable, "-m", "dflashdoctor", "gate", "--report-dir", str(report)]
    started = time.perf_counter()
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, cwd=work)
    elapsed = time.perf_counter() - started
    if proc.returncode != 0:
        print(f"gate exited {proc.returncode}:\n{proc.stdout[-1500:]}\n{proc.stderr[-800:]}")
    return started, elapsed


def _timeline(records: Path, started: float, report: Path) -> None:
    rows = []
    for path in records.glob("*.json"):
        item = json.loads(path.read_text())
        rows.append(item)
    rows.sort(key=lambda r: r["started"])
    for item in rows:
        what = item["comm"] if item["kind"] == "fork" else " ".join(Path(a).name for a in item["argv"][:3])
        print(
            f"  {item['started'] - started:6.2f} -> {item['ended'] - started:6.2f} s  "
            f"({item['ended'] - item['started']:5.2f})  {item['kind']:4}  pid {item['pid']:>7}  {what[:70]}"
        )
    try:
        results = json.loads((report / "report.json").read_text())["results"]
        observed = json.loads((report / "observations.json").read_text())["probes"]
    except (OSError, ValueError, KeyError):
        return
    print("  sections: " + ", ".join(f"{r['probe']} {r.get('duration_s', 0):.2f}" for r in results))
    compile_probe = observed.get("check-compile") or {}
    marks = {k: compile_probe.get(k) for k in ("import_s", "setup_s")}
    phases = {k: round(v.get("wall_s", 0), 2) for k, v in (compile_probe.get("phases") or {}).items()}
    print(f"  check-compile: {marks} phases {[(k, v) for k, v in phases.items() if v >= 0.05]}")


def _profiles(records: Path, out: Path) -> None:
    for path in sorted(records.glob("*.prof")):
        meta = json.loads(path.with_suffix(".json").read_text())
        if meta["kind"] == "exec" and "dflashdoctor" not in " ".join(meta["argv"]):
            continue  # helpers (compile workers, kernel loaders): their times are in the timeline
        name = meta["comm"] if meta["kind"] == "fork" else "doctor" if "gate" in meta["argv"] else "host"
        kept = out / f"{name}-{meta['pid']}.prof"
        kept.write_bytes(path.read_bytes())
        print(f"\n== {name} (pid {meta['pid']}, {meta['ended'] - meta['started']:.2f} s under the profiler)")
        try:
            pstats.Stats(str(path), stream=sys.stdout).sort_stats("cumulative").print_stats(45)
        except (TypeError, ValueError, EOFError) as exc:  # a profile cut short as its process was killed
            print(f"   unreadable profile: {exc}"[:200])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--profile", action="store_true", help="then one more warm gate under cProfile")
    parser.add_argument("--package", type=Path, default=ROOT, help="time the dflashdoctor of this folder")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    package = args.package.resolve()
    with tempfile.TemporaryDirectory(prefix="dflashdoctor-gate-profile-") as tmp:
        work = Path(tmp)
        hook_dir = work / "hook"
        hook_dir.mkdir()
        (hook_dir / "sitecustomize.py").write_text(SITECUSTOMIZE)
        cache = work / "cache"
        _, cold = _gate(work, cache, work / "cold", None, "time", package)
        print(f"dflashdoctor from {package}; cold gate {cold:.1f} s")
        walls = []
        for repeat in range(args.repeats):
            records = hook_dir / f"time-{repeat}"
            records.mkdir()
            started, wall = _gate(work, cache, work / f"warm-{repeat}", records, "time", package)
            walls.append(wall)
            print(f"warm gate {repeat}: {wall:.2f} s")
            _timeline(records, started, work / f"warm-{repeat}")
        if args.profile:
            records = hook_dir / "profile"
            records.mkdir()
            started, wall = _gate(work, cache, work / "profiled", records, "profile", package)
            print(f"\nwarm gate under cProfile: {wall:.2f} s")
            _timeline(records, started, work / "profiled")
            _profiles(records, args.out)


if __name__ == "__main__":
    main()
