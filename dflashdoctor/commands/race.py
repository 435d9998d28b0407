"""`race`: its options, what is bad input before the probe starts, and the probe's config."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from dflashdoctor.autotune import FIXES, KERNELS
from dflashdoctor.errors import BadInput
from dflashdoctor.judges.race import judge
from dflashdoctor.limits import MAX_TRIALS, count_problem
from dflashdoctor.observations import RaceObservations
from dflashdoctor.options import cli
from dflashdoctor.probe_configs import RaceConfig
from dflashdoctor.probe_spec import ProbeSpec

MAX_THREADS = 64
_PROBE_MARGIN_S = 60.0  # of --timeout, for the probe's own start, audit and report


@dataclass
class RaceOptions:
    threads: int = field(default=2, metadata=cli("Threads sharing one autotuner."))
    kernel: str = field(
        default="stub",
        metadata=cli(
            "stub (a real triton autotuner, interpreted, no GPU), fla (FLA's gated delta rule), reference "
            "(the reference target's forwards), or a TARGET fn(worker, device)."
        ),
    )
    trials: int = field(default=5, metadata=cli("Unforced trials after the forced one, for a failure rate."))
    fix: str = field(default="none", metadata=cli("none, lock (per-instance lock on Autotuner.run) or sequential."))
    seed: int = field(default=0, metadata=cli("Seeds the inputs and the natural trials' jitter."))
    processes: int = field(default=0, metadata=cli("Also run one process per worker over gloo (0: off)."))
    binaries_dir: Path | None = field(
        default=None,
        metadata=cli(
            "Keep real kernels' compiled binaries here across runs (tuning stays cold regardless).",
            flag="--triton-binaries",
        ),
    )
    python: str | None = None
    ssh: str | None = None  # [user@]host[:port]: the probed side runs there
    timeout_s: float = 600.0


def validate(options: RaceOptions) -> None:
    if not 2 <= options.threads <= MAX_THREADS:
        raise BadInput(f"--threads must be between 2 and {MAX_THREADS} (a race needs two)")
    if options.kernel not in KERNELS and ":" not in options.kernel:
        raise BadInput(
            f"unknown kernel {options.kernel!r}; expected {', '.join(KERNELS)}, or a TARGET module:attr / file.py:attr"
        )
    if options.fix not in FIXES:
        raise BadInput(f"unknown fix {options.fix!r}; expected one of {', '.join(FIXES)}")
    if options.binaries_dir is not None and options.binaries_dir.exists() and not options.binaries_dir.is_dir():
        raise BadInput(f"--triton-binaries {options.binaries_dir} is not a directory")
    if options.binaries_dir is not None and options.kernel == "stub":
        raise BadInput("--triton-binaries is for real kernels (--kernel fla, reference or a TARGET)")
    problem = count_problem(options.trials, "--trials", 0, MAX_TRIALS)
    if problem:
        raise BadInput(problem)
    if options.processes != 0 and count_problem(options.processes, "--processes", 2, MAX_THREADS):
        raise BadInput(f"--processes must be 0 (off) or a whole number from 2 to {MAX_THREADS}")


def probe_config(options: RaceOptions) -> RaceConfig:
    return RaceConfig(
        threads=options.threads,
        kernel=options.kernel,
        trials=options.trials,
        fix=options.fix,
        seed=options.seed,
        processes=options.processes,
        trials_budget_s=max(60.0, options.timeout_s - _PROBE_MARGIN_S),
        binaries_dir=str(options.binaries_dir.resolve()) if options.binaries_dir else None,
    )


def subject(options: RaceOptions) -> dict[str, str]:
    return {"target": f"{options.kernel} kernel, {options.threads} threads, fix {options.fix}"}


def variables(options: RaceOptions) -> dict[str, str]:
    """The stub kernel runs in triton's interpreter, which `triton.jit` picks as it decorates the
    kernel; real kernels run in child processes that set it only where there is no GPU."""
    return {"TRITON_INTERPRET": "1"} if options.kernel == "stub" else {}


SPEC = ProbeSpec(
    name="race",
    summary="Does the installed Triton autotuner break when threads share it, and does the fix hold?",
    options=RaceOptions,
    observations=RaceObservations,
    judge=judge,
    script="race.py",
    probe_config=probe_config,
    validate=validate,
    subject=subject,
    variables=variables,
    skipped_without={"triton": "no triton autotuner to race"},
    forked_in_gate=True,
)
