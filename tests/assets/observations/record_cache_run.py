"""Records the `cache` and `run` observations that tests/unit/test_cache_judge.py and
tests/unit/test_run_judge.py judge: each scenario builds its input in a temporary folder (cache trees
with tests/cache_tree.py, or a target script of tests/targets/run/), runs the real CLI in a child
process with --report-dir, and keeps the report folder's observations.json (and, for `run`, its
events/) as tests/assets/observations/cpu/<scenario>.json (.events/).

    python3 tests/assets/observations/record_cache_run.py [SCENARIO ...]

Scenarios that need root (another local user through setpriv, a tmpfs mount) say so and are skipped
elsewhere, keeping the recording there is. Also copies the H200 out-of-memory run kept in
reports/examples/h200-run-oom/ to h200/run-oom.json and h200/run-oom.events/.
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
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
sys.path.insert(0, str(REPO))

from tests import cache_tree  # noqa: E402

CPU = HERE / "cpu"
SCRIPTS = REPO / "tests" / "targets" / "run"
H200_OOM = REPO / "reports" / "examples" / "h200-run-oom"

# As root, file permissions bind only without the capabilities that let root read and write past them.
_CAPABILITIES = "-dac_override,-dac_read_search"
PERMISSIONS_BIND = ("setpriv", f"--bounding-set={_CAPABILITIES}", f"--inh-caps={_CAPABILITIES}")
NOBODY = ("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all", "--bounding-set=-all")


class Skipped(Exception):
    """This machine cannot make the scenario; its recording is left as it is."""


def needs_root(what: str) -> None:
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        raise Skipped(f"{what} needs root and setpriv")


def cli(work: Path, *args: str, env: dict[str, str] | None = None, prefix: tuple[str, ...] = ()) -> Path:
    """`python3 -m dflashdoctor ARGS` (options after the command's words, `-- CMD` last) in a child
    process, its report in work/report; returns that folder."""
    report = work / "report"
    shutil.rmtree(report, ignore_errors=True)
    words = 2 if args[0] == "cache" else 1
    command = [*prefix, sys.executable, "-m", "dflashdoctor", *args[:words], "--report-dir", str(report), *args[words:]]
    print("  $", " ".join(command), flush=True)
    done = subprocess.run(
        command, cwd=work, env={**os.environ, **(env or {})}, capture_output=True, text=True, timeout=600
    )
    print(f"  exit {done.returncode}", flush=True)
    if not (report / "observations.json").is_file():
        raise RuntimeError(f"no observations.json: {done.stderr[-2000:]}")
    return report


def keep(name: str, report: Path, folder: Path = CPU) -> None:
    """report/observations.json as folder/<name>.json, and report/events/ (if any) as <name>.events/."""
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(report / "observations.json", folder / f"{name}.json")
    events = folder / f"{name}.events"
    shutil.rmtree(events, ignore_errors=True)
    written = report / "events"
    kept = [p for p in written.iterdir() if not p.name.startswith(".")] if written.is_dir() else []
    if kept:  # what the processes wrote (not the run's claim on the folder); git keeps no empty folder
        shutil.copytree(report / "events", events, ignore=shutil.ignore_patterns(".*"))


def triton_tree(work: Path, kernels: int = 2) -> tuple[Path, list[Path]]:
    """A Triton root of `kernels` kernel entries (plus the autotune and driver-module folders
    triton writes without group files), by absolute path as triton writes its group files."""
    root = work / "triton"
    return root, cache_tree.healthy_tree(root, kernels)


SCENARIOS: dict[str, Callable[[Path], Path]] = {}


def scenario(function: Callable[[Path], Path]) -> Callable[[Path], Path]:
    SCENARIOS[function.__name__.replace("_", "-")] = function
    return function


# cache --------------------------------------------------------------------------------------------


@scenario
def cache_healthy(work: Path) -> Path:
    """Also the base of the network-filesystem variant (no NFS mount here)."""
    root, _ = triton_tree(work)
    return cli(work, "cache", "check", "--triton-dir", str(root))


@scenario
def cache_corrupt(work: Path) -> Path:
    root, folders = triton_tree(work)
    cache_tree.truncate_binary(folders[1])
    return cli(work, "cache", "check", "--triton-dir", str(root))


@scenario
def cache_unreadable(work: Path) -> Path:
    needs_root("an entry root cannot read")
    root, folders = triton_tree(work)
    folders[0].chmod(0)
    try:
        return cli(work, "cache", "check", "--triton-dir", str(root), prefix=PERMISSIONS_BIND)
    finally:
        folders[0].chmod(0o755)


@scenario
def cache_orphan_tmp(work: Path) -> Path:
    root, folders = triton_tree(work)
    cache_tree.stray_tmp(folders[0])
    return cli(work, "cache", "check", "--triton-dir", str(root))


@scenario
def cache_incomplete(work: Path) -> Path:
    root, folders = triton_tree(work)
    cache_tree.no_group(folders[0])
    return cli(work, "cache", "check", "--triton-dir", str(root))


@scenario
def cache_stale(work: Path) -> Path:
    root, _ = triton_tree(work, kernels=1)
    cache_tree.write_kernel(root, "old", version="0.0.1")
    return cli(work, "cache", "check", "--triton-dir", str(root))


@scenario
def cache_relative(work: Path) -> Path:
    cache_tree.healthy_tree(work / "rel-cache", 1)
    env = {"TRITON_CACHE_DIR": "rel-cache", "TORCHINDUCTOR_CACHE_DIR": str(work / "inductor")}
    return cli(work, "cache", "check", env=env)


@scenario
def cache_shared_root(work: Path) -> Path:
    root, _ = triton_tree(work, kernels=1)
    return cli(work, "cache", "check", "--triton-dir", str(root), env={"WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"})


@scenario
def cache_low_space(work: Path) -> Path:
    """A real 1 MiB tmpfs under the root."""
    needs_root("a tmpfs mount")
    small = work / "small"
    small.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1M", "tmpfs", str(small)]).returncode != 0:
        raise Skipped("mount -t tmpfs failed")
    try:
        root = small / "triton"
        cache_tree.healthy_tree(root, 1)
        return cli(work, "cache", "check", "--triton-dir", str(root))
    finally:
        subprocess.run(["umount", str(small)], check=True)


@scenario
def cache_not_writable(work: Path) -> Path:
    needs_root("a root this user cannot write")
    root, _ = triton_tree(work, kernels=1)
    root.chmod(0o555)
    try:
        return cli(work, "cache", "check", "--triton-dir", str(root), prefix=PERMISSIONS_BIND)
    finally:
        root.chmod(0o755)


def _fixed(work: Path) -> tuple[Path, Path, Path]:
    """A tree whose second kernel is truncated, after `cache fix`: (root, broken entry, report)."""
    root, folders = triton_tree(work)
    broken = cache_tree.truncate_binary(folders[1])
    return root, broken, cli(work, "cache", "fix", "--triton-dir", str(root))


@scenario
def cache_fix(work: Path) -> Path:
    return _fixed(work)[2]


@scenario
def cache_restore(work: Path) -> Path:
    root, _, _ = _fixed(work)
    return cli(work, "cache", "restore", "--triton-dir", str(root))


@scenario
def cache_restore_conflict(work: Path) -> Path:
    """After the fix, the entry's place is taken again (as triton rebuilding it would take it)."""
    root, broken, _ = _fixed(work)
    broken.mkdir()
    return cli(work, "cache", "restore", "--triton-dir", str(root))


@scenario
def cache_fix_refused(work: Path) -> Path:
    """Another local user (nobody) made the quarantine folder first, in a world-writable folder."""
    needs_root("another local user's quarantine")
    shared = Path(tempfile.mkdtemp(prefix="dflashdoctor-shared-", dir="/tmp"))
    shared.chmod(0o1777)
    try:
        root = shared / "triton"
        folders = cache_tree.healthy_tree(root, 2)
        cache_tree.truncate_binary(folders[1])
        home = root.parent / f"{root.name}.dflashdoctor-quarantine"
        subprocess.run([*NOBODY, "mkdir", "-m", "700", str(home)], check=True)
        return cli(work, "cache", "fix", "--triton-dir", str(root))
    finally:
        shutil.rmtree(shared, ignore_errors=True)


# run ----------------------------------------------------------------------------------------------


@scenario
def run_eager_flex(work: Path) -> Path:
    return cli(work, "run", "--", sys.executable, str(SCRIPTS / "eager_flex.py"))


@scenario
def run_raises(work: Path) -> Path:
    return cli(work, "run", "--", sys.executable, str(SCRIPTS / "raises_in_module.py"))


@scenario
def run_exits_3(work: Path) -> Path:
    return cli(work, "run", "--", sys.executable, str(SCRIPTS / "exits_3.py"))


@scenario
def run_deadlock(work: Path) -> Path:
    return cli(work, "run", "--hang-timeout", "4", "--", sys.executable, str(SCRIPTS / "deadlock.py"))


@scenario
def run_not_python(work: Path) -> Path:
    """A command no Python process of which loads the agent."""
    return cli(work, "run", "--", "sh", "-c", "echo not python")


@scenario
def run_interrupted(work: Path) -> Path:
    """SIGTERM to dflashdoctor (a CI runner cancelling the job) while the command sleeps."""
    report = work / "report"
    command = [
        *(sys.executable, "-m", "dflashdoctor", "run", "--report-dir", str(report)),
        *("--", sys.executable, "-c", "import time; time.sleep(300)"),
    ]
    print("  $", " ".join(command), "  (then SIGTERM)", flush=True)
    child = subprocess.Popen(command, cwd=work, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not any((report / "events").glob("*.jsonl")):
        if time.monotonic() > deadline or child.poll() is not None:
            child.kill()
            raise RuntimeError("the run wrote no events")
        time.sleep(0.1)
    time.sleep(1.0)  # the agent's first events are written
    child.send_signal(signal.SIGTERM)
    _out, err = child.communicate(timeout=120)
    print(f"  exit {child.returncode}", flush=True)
    if child.returncode != 3:
        raise RuntimeError(f"expected exit 3: {err[-2000:]}")
    return report


def h200_run_oom() -> None:
    """The H200 out-of-memory run of reports/examples/h200-run-oom: its events, and the command and
    outcome its report.json measured (that run predates observations.json)."""
    overview = json.loads((H200_OOM / "report.json").read_text())["results"][0]["measurements"]
    folder = HERE / "h200"
    folder.mkdir(exist_ok=True)
    events = folder / "run-oom.events"
    shutil.rmtree(events, ignore_errors=True)
    shutil.copytree(H200_OOM / "events", events)
    outcome = {
        "returncode": overview["returncode"],
        "duration_s": overview["duration_s"],
        "hang": None,
        "interrupted": False,
        "stopped_by_doctor": False,
        "progress_lines": [],
    }
    document = {
        "schema": "dflashdoctor.observations/1",
        "command": "run",
        "probes": {"run": {"command": overview["command"], "outcome": outcome, "events": "events"}},
    }
    (folder / "run-oom.json").write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")
    print("h200/run-oom: copied from", H200_OOM.relative_to(REPO))


def main(names: list[str]) -> int:
    unknown = set(names) - set(SCENARIOS) - {"h200-run-oom"}
    if unknown:
        print("unknown scenarios:", ", ".join(sorted(unknown)), "; known:", ", ".join(SCENARIOS), file=sys.stderr)
        return 2
    failed = []
    for name, make in SCENARIOS.items():
        if names and name not in names:
            continue
        print(f"{name}:", flush=True)
        with tempfile.TemporaryDirectory(prefix=f"record-{name}-") as temp:
            try:
                keep(name, make(Path(temp)))
            except Skipped as why:
                print(f"  skipped ({why}); the recording there is stays")
            except Exception as exc:  # report every scenario that failed, then exit 1
                print(f"  FAILED: {exc}")
                failed.append(name)
    if not names or "h200-run-oom" in names:
        h200_run_oom()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
