"""What an installed FLA costs the gate's env and race probes, and the warm gate: FLA installed
against FLA hidden from the interpreter, in the same run (and, with --baseline, another version).

    OUT=dir python3 benchmarks/fla_probe_time.py [--out DIR] [--rounds 3] [--runs 2] [--gate-repeats 3]
                                                 [--baseline DIR | --baseline-rev REV] [--no-gate] [--no-profile]

Three parts, each printed and written to OUT (default $OUT, else ./fla-probe-time):
1. FLA's imports, each in a fresh interpreter after `import torch`: `import fla`, `import fla.utils`,
   env's `fla_state_from_source` (FLA's flags read from its source) and `fla_state` (fla.utils
   imported): seconds, FLA modules loaded, whether CUDA was initialised
   (`torch.cuda.is_initialized()`), and whether the two states are equal (what the env report says).
2. The env and race probes as the gate runs them: forked from a probe host (forkserver/) that has
   finished its imports, one probe at a time, with the gate's configuration; `--rounds` rounds, each
   variant in its own host per round (order rotating), `--runs` runs of each probe per host.
   Variants: this version with FLA installed; this version with FLA hidden (a sitecustomize that
   sets sys.modules["fla"] = None, chained to any sitecustomize already there): the floor FLA's
   cost is measured against; with `--baseline DIR` (a folder holding another version's dflashdoctor/
   and probes/: `git archive REV dflashdoctor probes | tar -x -C DIR`) that version with FLA
   installed (`--baseline-rev REV` makes that folder with git). Medians, and each variant's median
   over the hidden-FLA median. Unless --no-profile, one more run of each probe per variant under
   cProfile (OUT/profiles/<variant>/<probe>.txt: its 40 costliest calls).
3. Unless --no-gate: the whole warm gate (`python3 -m dflashdoctor gate`, caches warmed by one gate
   first), `--gate-repeats` rounds of the variants alternately; medians, ratio to hidden FLA, and the
   sections of each variant's last warm gate.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
HIDE_FLA = '''"""Benchmark only: FLA hidden from this interpreter (sys.modules["fla"] = None), then any other
sitecustomize on the path run as it would have been."""
import importlib.machinery, importlib.util, os, sys
sys.modules["fla"] = None
_here = os.path.dirname(os.path.abspath(__file__))
_path = [p for p in sys.path if os.path.abspath(p or ".") != _here]
_spec = importlib.machinery.PathFinder.find_spec("sitecustomize", _path)
if _spec is not None and _spec.loader is not None:
    _module = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_module)
'''
# Runs inside a forked probe: the probe under cProfile, stats written before the probe's os._exit.
PROFILED = """import cProfile, os, runpy, sys
script, stats = sys.argv[1], sys.argv[2]
sys.argv = [script] + sys.argv[3:]
sys.path[0] = os.path.dirname(os.path.abspath(script))
profile = cProfile.Profile()
_exit = os._exit
def _dump_then_exit(code):
    profile.disable()
    profile.dump_stats(stats)
    _exit(code)
os._exit = _dump_then_exit
profile.enable()
runpy.run_path(script, run_name="__main__")
_dump_then_exit(0)
"""
IMPORT_FACT = """import json, sys, time
import torch
{setup}
started = time.perf_counter()
{work}
seconds = time.perf_counter() - started
loaded = len([m for m in sys.modules if m == "fla" or m.startswith("fla.")])
print(json.dumps({{"s": round(seconds, 3), "fla_modules": loaded, "cuda_initialised": torch.cuda.is_initialized(),
                  "state": globals().get("state")}}))
"""
ENV_SETUP = (
    "import os, runpy\n"
    f"env = runpy.run_path({str(ROOT / 'probes' / 'env.py')!r})  # its GPU 0, from nvidia-smi, as the probe finds it\n"
    "gpu0 = env['gpu_zero'](env['_smi_gpus']()[0], dict(os.environ))\n"
    "torch.cuda.is_available()  # asked by env before it reads FLA"
)
# (set-up, untimed; the work timed)
IMPORT_WORK = {
    "import fla": ("", "import fla"),
    "import fla.utils": ("", "import fla.utils"),
    "fla_state_from_source (env now)": (
        ENV_SETUP + "\nfrom dflashdoctor.fla_guards import fla_state_from_source",
        "state = fla_state_from_source(gpu0)",
    ),
    "fla_state (fla.utils imported)": (
        "from dflashdoctor.fla_guards import fla_state\ntorch.cuda.is_available()",
        "state = fla_state()",
    ),
}


def _env(package: Path, hide: Path | None) -> dict[str, str]:
    """The environment a variant runs in: its package first on the path, FLA hidden or not."""
    env = dict(os.environ)
    parts = [str(hide)] if hide else []
    env["PYTHONPATH"] = os.pathsep.join([*parts, str(package), *filter(None, [env.get("PYTHONPATH")])])
    return env


def _json_line(done: subprocess.CompletedProcess[str], what: str) -> dict[str, Any]:
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"{what} exited {done.returncode}:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
    return json.loads(lines[-1])


def import_facts(work: Path) -> dict[str, dict[str, Any]]:
    """Part 1: each way of reaching FLA in a fresh interpreter of this version."""
    sys.path.insert(0, str(ROOT))
    from dflashdoctor.runner import bytecode_env  # the probes' bytecode cache, where the image keeps none

    facts = {}
    for name, (setup, code) in IMPORT_WORK.items():
        done = subprocess.run(
            [sys.executable, "-c", IMPORT_FACT.format(setup=setup, work=code)],
            env=_env(ROOT, None) | bytecode_env(sys.executable),
            cwd=work,
            capture_output=True,
            text=True,
            timeout=300,
        )
        facts[name] = _json_line(done, name)
    return facts


def _ensure_probes_link(package: Path) -> None:
    """A baseline made by `git archive REV dflashdoctor probes` finds its probes as the wheel does
    (dflashdoctor/probes): without the link an editable install's finder would hand it this
    checkout's probes."""
    link = package / "dflashdoctor" / "probes"
    if (package / "probes").is_dir() and not link.exists():
        link.symlink_to(Path("..") / "probes")


def drive(runs: int, profiles: Path | None) -> dict[str, Any]:
    """In a variant's interpreter: a probe host as the gate opens it, then env and race forked from
    it one at a time, `runs` times each (a first env run, untimed, waits for the host's imports)."""
    import dflashdoctor
    from dflashdoctor.commands.race import RaceOptions, probe_config
    from dflashdoctor.forkserver.client import hosting
    from dflashdoctor.runner import probe_env, probes_dir, run_probe

    probes = {
        "env": ("env.py", {}, {}),
        "race": ("race.py", probe_config(RaceOptions(timeout_s=600.0)), {"TRITON_INTERPRET": "1"}),
    }
    python = sys.executable
    times: dict[str, list[float]] = {name: [] for name in probes}
    seen: dict[str, Any] = {}
    with hosting(python, probe_env(python), "auto") as host:
        run_probe("env", "env.py", {}, python=python, timeout_s=600.0, forkable=True)  # waits for the host
        for _ in range(runs):
            for name, (script, config, env) in probes.items():
                done = run_probe(name, script, config, python=python, timeout_s=600.0, env=env, forkable=True)
                times[name].append(done.duration_s)
                seen[name] = {"returncode": done.returncode, "fla": (done.payload or {}).get("fla", "no payload")}
        if profiles is not None and host is not None:
            for name, (script, config, env) in probes.items():
                seen[name]["profile_s"] = _profiled(host, probes_dir() / script, config, env, profiles / name)
        described = host.describe() if host is not None else "no probe host"
    return {
        "package": dflashdoctor.__file__,
        "probes": str(probes_dir()),
        "host": described,
        "times": times,
        "seen": seen,
    }


def _profiled(host: Any, script: Path, config: dict[str, Any], env: dict[str, str], stem: Path) -> float:
    """One forked run of a probe under cProfile; its 40 costliest calls by cumulative time in STEM.txt."""
    import pstats

    from dflashdoctor.runner import probe_env

    stem.parent.mkdir(parents=True, exist_ok=True)
    wrapper, config_path, out = (
        stem.with_suffix(".wrapper.py"),
        stem.with_suffix(".config.json"),
        stem.with_suffix(".out.json"),
    )
    wrapper.write_text(PROFILED)
    config_path.write_text(json.dumps(config))
    argv = [
        str(wrapper),
        str(script),
        str(stem.with_suffix(".pstats")),
        "--config",
        str(config_path),
        "--out",
        str(out),
    ]
    started = time.monotonic()
    child = host.start(
        argv, {**probe_env(sys.executable), **env}, stem.with_suffix(".stdout"), stem.with_suffix(".stderr")
    )
    if child is None:
        return -1.0
    child.wait(timeout=600)
    seconds = round(time.monotonic() - started, 3)
    with open(stem.with_suffix(".txt"), "w", encoding="utf-8") as handle:
        handle.write(f"{script.name} forked from the probe host, {seconds} s under cProfile\n")
        pstats.Stats(str(stem.with_suffix(".pstats")), stream=handle).sort_stats("cumulative").print_stats(40)
    return seconds


def _variant_run(package: Path, hide: Path | None, runs: int, profiles: Path | None, work: Path) -> dict[str, Any]:
    argv = [sys.executable, str(Path(__file__).resolve()), "--driver", "--runs", str(runs)]
    argv += ["--profile-dir", str(profiles)] if profiles else []
    done = subprocess.run(argv, env=_env(package, hide), cwd=work, capture_output=True, text=True, timeout=3000)
    return _json_line(done, f"the driver for {package}{' (FLA hidden)' if hide else ''}")


def _gate(package: Path, hide: Path | None, work: Path, report: Path) -> float:
    """One gate's wall time, in `work` (no configuration there: the embedded default)."""
    env = _env(package, hide) | {
        "TORCHINDUCTOR_CACHE_DIR": str(work / "inductor"),
        "TRITON_CACHE_DIR": str(work / "triton"),
    }
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "dflashdoctor", "gate", "--report-dir", str(report)],
        env=env,
        cwd=work,
        capture_output=True,
        text=True,
        timeout=900,
    )
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        print(
            f"gate ({package}, FLA {'hidden' if hide else 'installed'}) exited {done.returncode}: {done.stdout[-1500:]}"
        )
    return seconds


def _gate_report(work: Path, variant: str, index: int) -> Path:
    return work / f"gate-{index}-{variant.replace(', ', '-').replace(' ', '-')}"


def _sections(report: Path) -> str:
    try:
        results = json.loads((report / "report.json").read_text())["results"]
    except (OSError, ValueError, KeyError):
        return "no report"
    return ", ".join(f"{r['probe']} {r.get('duration_s', 0):.1f} s ({r.get('status')})" for r in results)


def _median_line(name: str, samples: list[float], floor: float | None) -> str:
    median = statistics.median(samples)
    ratio = f"   / FLA hidden {median / floor:.2f}" if floor else ""
    return f"  {name:<34} median {median:6.2f} s{ratio}   runs {', '.join(f'{s:.2f}' for s in samples)}"


class Output:
    """Everything printed also goes to OUT/fla-probe-time.txt."""

    def __init__(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self._file = open(folder / "fla-probe-time.txt", "w", encoding="utf-8")  # noqa: SIM115 (closed at exit)

    def __call__(self, line: str = "") -> None:
        print(line, flush=True)
        self._file.write(line + "\n")
        self._file.flush()


def _variants(args: argparse.Namespace, hide: Path, work: Path, say: Output) -> dict[str, tuple[Path, Path | None]]:
    variants = {"FLA installed": (ROOT, None), "FLA hidden": (ROOT, hide)}
    baseline = args.baseline.resolve() if args.baseline else _archived(args.baseline_rev, work, say)
    if baseline is not None:
        _ensure_probes_link(baseline)
        variants["baseline, FLA installed"] = (baseline, None)
    return variants


def _archived(rev: str | None, work: Path, say: Output) -> Path | None:
    """`git archive REV dflashdoctor probes` into the work folder; None (said) where git cannot."""
    if not rev:
        return None
    folder = work / "baseline"
    folder.mkdir()
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "dflashdoctor", "probes"], capture_output=True)
    if archive.returncode != 0:
        say(f"no baseline: git archive {rev} failed: {archive.stderr.decode(errors='replace').strip()[-300:]}")
        return None
    subprocess.run(["tar", "-x", "-C", str(folder)], input=archive.stdout, check=True)
    say(f"baseline: {rev} (git archive)")
    return folder


def _part_imports(
    say: Output,
    _args: argparse.Namespace,
    _variants: dict[str, tuple[Path, Path | None]],
    work: Path,
    record: dict[str, Any],
) -> None:
    say("1. FLA's imports, each in a fresh interpreter after `import torch` (this version)")
    facts = record["imports"] = import_facts(work)
    for name, fact in facts.items():
        modules, initialised = fact["fla_modules"], fact["cuda_initialised"]
        say(f"  {name:<34} {fact['s']:6.3f} s, {modules:3d} fla modules, CUDA initialised: {initialised}")
    read, imported = facts["fla_state_from_source (env now)"]["state"], facts["fla_state (fla.utils imported)"]["state"]
    say(f"  env's FLA state read from source == imported: {read == imported}")
    if read != imported:
        say(f"    read:     {json.dumps(read)}\n    imported: {json.dumps(imported)}")


def _part_probes(
    say: Output,
    args: argparse.Namespace,
    variants: dict[str, tuple[Path, Path | None]],
    work: Path,
    record: dict[str, Any],
) -> None:
    say(f"\n2. env and race forked from a warm probe host, one at a time ({args.rounds} rounds x {args.runs} runs)")
    times: dict[str, dict[str, list[float]]] = {v: {"env": [], "race": []} for v in variants}
    names = list(variants)
    for round_index in range(args.rounds):
        for name in names[round_index % len(names) :] + names[: round_index % len(names)]:
            package, hidden = variants[name]
            profiles = (
                args.out / "profiles" / name.replace(", ", "-").replace(" ", "-")
                if round_index == 0 and args.profile
                else None
            )
            result = _variant_run(package, hidden, args.runs, profiles, work)
            for probe in ("env", "race"):
                times[name][probe] += result["times"][probe]
            record["probes"].setdefault(name, []).append(result)
        say(
            f"  round {round_index + 1}: "
            + "; ".join(f"{v} env {t['env'][-1]:.2f} race {t['race'][-1]:.2f}" for v, t in times.items())
        )
    for probe in ("env", "race"):
        floor = statistics.median(times["FLA hidden"][probe])
        say(f"  {probe}:")
        for name in variants:
            say(_median_line(name, times[name][probe], None if name == "FLA hidden" else floor))
    for name in variants:
        last = record["probes"][name][-1]
        say(f"  {name}: host {last['host']}; dflashdoctor {last['package']}, probes {last['probes']}")
        say(f"    env saw fla {_short(last['seen']['env']['fla'])}; race saw fla {last['seen']['race']['fla']!r}")


def _short(fla: Any) -> str:
    if not isinstance(fla, dict):
        return repr(fla)
    held = [g["function"] for g in fla.get("guards", []) if g.get("applies")]
    where = f"platform {fla.get('platform')} gpu {fla.get('gpu')} usable {fla.get('usable')}"
    return f"{fla.get('version')} {where} guards holding {held}"


def _part_gate(
    say: Output,
    args: argparse.Namespace,
    variants: dict[str, tuple[Path, Path | None]],
    work: Path,
    record: dict[str, Any],
) -> None:
    say(f"\n3. the warm gate ({args.gate_repeats} rounds, variants alternately; caches warmed by one gate first)")
    cold = _gate(ROOT, None, work, work / "gate-cold")
    say(f"  first gate (cold caches, FLA installed): {cold:.1f} s")
    walls: dict[str, list[float]] = {v: [] for v in variants}
    for _ in range(args.gate_repeats):
        for name, (package, hidden) in variants.items():
            walls[name].append(_gate(package, hidden, work, _gate_report(work, name, len(walls[name]))))
    floor = statistics.median(walls["FLA hidden"])
    for name in variants:
        say(_median_line(name, walls[name], None if name == "FLA hidden" else floor))
        say(f"    last warm gate's sections: {_sections(_gate_report(work, name, len(walls[name]) - 1))}")
    record["gate"] = {"cold_s": cold, "warm_s": walls}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or "fla-probe-time"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--runs", type=int, default=2, help="runs of each probe per host")
    parser.add_argument("--gate-repeats", type=int, default=3)
    parser.add_argument("--baseline", type=Path, help="another version's folder (dflashdoctor/ and probes/)")
    parser.add_argument("--baseline-rev", help="another version as a git revision of this checkout (git archive)")
    parser.add_argument("--no-gate", dest="gate", action="store_false")
    parser.add_argument("--no-profile", dest="profile", action="store_false")
    parser.add_argument("--driver", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--profile-dir", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.driver:
        print(json.dumps(drive(args.runs, args.profile_dir)))
        return
    args.out = args.out.resolve()
    say = Output(args.out)
    say(f"{time.strftime('%Y-%m-%d %H:%M')}  python {sys.version.split()[0]}  {_versions()}")
    record: dict[str, Any] = {"probes": {}}
    with tempfile.TemporaryDirectory(prefix="dflashdoctor-fla-bench-") as tmp:
        work = Path(tmp)
        hide = work / "hide-fla"
        hide.mkdir()
        (hide / "sitecustomize.py").write_text(HIDE_FLA)
        variants = _variants(args, hide, work, say)
        parts = [_part_imports, _part_probes] + ([_part_gate] if args.gate else [])
        for part in parts:  # each part's record kept as soon as it is done: a run cut short keeps the rest
            part(say, args, variants, work, record)
            (args.out / "fla-probe-time.json").write_text(json.dumps(record, indent=1, default=str))


def _versions() -> str:
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import torch, triton; from importlib import metadata; "
            "print('torch', torch.__version__, 'triton', triton.__version__, 'fla-core', metadata.version('fla-core'), "
            "'cuda', torch.cuda.is_available())",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    return done.stdout.strip() or done.stderr.strip()[-300:]


if __name__ == "__main__":
    main()
