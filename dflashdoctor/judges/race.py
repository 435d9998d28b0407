"""Judges the race probe: what the installed autotuner shares, whether threads break it, whether the fix holds.

Behaviour decides, not the version number: the forced trial without a fix is the reproduction. If
it fails, the installed autotuner has the race; a fix is proven by its own forced trial and natural
trials passing with outputs equal to a single-threaded run.
"""

from __future__ import annotations

from collections.abc import Sequence

from dflashdoctor.budgets import Budgets
from dflashdoctor.codes import finding
from dflashdoctor.judges.base import Judge, frame_where
from dflashdoctor.observations import RaceObservations
from dflashdoctor.records import KernelTrialRecord, ProcessesRecord, ReferenceTarget, TrialRecord
from dflashdoctor.report import Bar, CheckStatus, Comparison, ProbeResult

_RACE_ERRORS = ("autotuner-race", "concurrent-autotuner-entry")

REFS = [
    "https://github.com/triton-lang/triton/issues/3095",
    "https://github.com/triton-lang/triton/issues/11494",
    "https://github.com/triton-lang/triton/pull/5893",
    "https://github.com/triton-lang/triton/pull/8437",
    "https://github.com/triton-lang/triton/pull/11509",
    "https://github.com/fla-org/flash-linear-attention/issues/66",
    "https://github.com/turboderp-org/exllamav3/issues/308",
]
FIX_ADVICE = (
    "In order of preference: (1) one process per GPU pair (torchrun) instead of threads, so no autotuner "
    "is shared (`--processes N` shows it); (2) run the target forwards one after another (`--fix sequential`); "
    "(3) in-process, a per-instance re-entrant lock around Autotuner.run: `with "
    "dflashdoctor.hooks.AutotunerGuard(serialize=True):` around training (`--fix lock`). A warm-up pass "
    "only narrows the window."
)


class RaceJudge(Judge):
    def __init__(self, observations: RaceObservations, budgets: Budgets) -> None:
        super().__init__("race", budgets)
        self.observations = observations
        self.fix = observations.fix

    def judge(self) -> ProbeResult:
        obs = self.observations
        self._audit()
        if obs.forced_unfixed is not None:  # the stub kernel: forced reproduction, then natural trials
            self._reproduction(obs.forced_unfixed)
            if self.fix != "none" and obs.forced_fixed is not None:
                self._fixed(obs.forced_fixed)
            self._series(obs.natural, "natural trials", "unforced trials")
        if obs.kernel_skipped:
            self._check("real kernels", "skip", obs.kernel_skipped)
        if obs.reference is not None:
            self._reference(obs.reference)
        if obs.kernel_trials is not None:
            self.measurements["devices"] = obs.devices
            self.measurements["live_autotuners"] = obs.live_autotuners
            self._series(obs.kernel_trials, "kernel trials", "trials (each tuning cold)")
            self._cold_tuning(obs.kernel_trials)
            self._reached(obs.kernel_trials)
        if obs.processes:
            self._processes(obs.processes)
        self.measurements.update(
            triton=obs.triton, torch=obs.torch, fla=obs.fla, kernel=obs.kernel, threads=obs.threads, fix=obs.fix
        )
        if self.budgets.held_by_gate:
            self._for_the_pipeline()
        self._trials_chart()
        return self.result()

    def _trials_chart(self) -> None:
        """The share of trials that failed per fix and kind (forced, natural, real kernels tuning cold),
        to compare at a glance; each bar's label says the counts."""
        obs = self.observations
        trials = [t for t in (obs.forced_unfixed, obs.forced_fixed) if t is not None]
        trials += [*obs.natural, *(obs.kernel_trials or [])]
        groups: dict[str, list[TrialRecord]] = {}
        for trial in trials:
            kind = "forced" if trial.get("forced") else "cold kernels" if "binaries_cached" in trial else "natural"
            groups.setdefault(f"fix {trial.get('fix')}, {kind}", []).append(trial)
        bars = []
        for label, group in groups.items():  # a share: 2 of 2 and 3 of 6 are not one bar length apart
            failed = sum(1 for t in group if t.get("failed"))
            share = 100.0 * failed / len(group)
            bars.append(Bar(f"{label}: {failed} of {len(group)}", share, "failed" if failed else "passed"))
        if bars:
            self.comparisons.append(Comparison(title="share of trials that failed, per fix", unit="%", bars=bars))

    def _for_the_pipeline(self) -> None:
        """The forced reproduction proves the installed triton's autotuner is racy; that is this
        pipeline's error only when it runs autotuned kernels from several threads at once
        (`threaded_autotuners`), otherwise a warning with the reproduction as evidence."""
        if self.budgets.threaded_autotuners:
            self._check("pipeline", "info", "threaded_autotuners = true: the race is this pipeline's error")
            return
        reproduction = [f for f in self.findings if f.code in _RACE_ERRORS]
        if not reproduction:
            return
        self._accept(set(_RACE_ERRORS), "warn", "installed triton is racy")
        shared = next((f for f in self.findings if f.code == "autotuner-shared-state"), None)
        if shared is not None:
            shared.evidence["forced_reproduction"] = [f"{f.code}: {f.title}" for f in reproduction]
            shared.detail += (
                " The forced reproduction failed here, so the installed triton has the race; the configured "
                "pipeline does not run autotuned kernels from several threads (threaded_autotuners = false), "
                "so it is a warning."
            )
        self._check("pipeline", "info", "threaded_autotuners = false: the race is reported as a warning")

    def _audit(self) -> None:
        audits = self.observations.audit
        self.measurements["audit"] = audits
        for audit in audits:
            name = f"audit {audit['cls'].rsplit('.', 1)[-1]}"
            if not audit["audited"]:
                self._check(name, "skip", audit["reason"])
                continue
            shared = audit["per_call_state"]
            if audit["base_run"] and not shared:
                inherits = "its run calls super().run: it inherits the base class's per-call state"
                self._check(name, "pass" if audit["locked"] else "warn", inherits)
                continue
            if not shared or audit["locked"]:
                self._check(name, "pass", "no unlocked per-call state in run")
                continue
            listed = "; ".join(
                f"self.{attr} (written by {', '.join(a['written_by'])}; read by {', '.join(a['read_by']) or 'none'})"
                for attr, a in shared.items()
            )
            self.findings.append(
                finding(
                    "autotuner-shared-state",
                    f"{audit['cls']}.run keeps per-call state on the shared instance, without a lock",
                    detail=f"Every thread that calls the same kernel shares these: {listed}. Two threads "
                    "inside one call overwrite each other's `nargs`; the one that finishes first sets it to None.",
                    evidence=dict(audit),  # a copy: the pipeline's verdict adds to it
                    fix=FIX_ADVICE,
                    refs=REFS,
                )
            )
            self._check(name, "warn", f"{len(shared)} attributes of per-call state, no lock", "autotuner-shared-state")

    def _reproduction(self, trial: TrialRecord) -> None:
        self.measurements["forced_unfixed"] = trial
        if not trial["failed"]:
            self._check(
                "forced race",
                "pass",
                f"{trial['threads']} threads with the interleaving forced: no failure; the installed triton "
                "survives the race (decided by behaviour)",
            )
            return
        if self.fix == "none":
            code = self._failure(trial, "Threads sharing one triton autotuner crash it")
            self._check("forced race", "fail", self._trial_summary(trial), code)
        else:
            self._check("forced race", "info", f"without a fix: {self._trial_summary(trial)}")

    def _fixed(self, trial: TrialRecord) -> None:
        self.measurements["forced_fixed"] = trial
        codes = [self._failure(trial, f"The race still happens with --fix {self.fix}")] if trial["failed"] else []
        verdict: CheckStatus = "fail" if trial["failed"] else "pass"
        entries = len(trial["concurrent_entries"])
        overlap = f"; {entries} concurrent entries waited for the lock" if self.fix == "lock" else ""
        self._check(f"fix {self.fix}", verdict, f"forced: {self._trial_summary(trial)}{overlap}", *codes)

    def _series(self, trials: Sequence[TrialRecord], name: str, what: str) -> None:
        """Trials under the chosen fix: a failure rate, and the race or the overlaps they showed."""
        key = name.replace(" ", "_")
        failed = [t for t in trials if t["failed"]]
        self.measurements.update({key: trials, f"{key}_failures": len(failed)})
        if not trials:
            return
        self.measurements[f"{key}_failure_rate"] = round(len(failed) / len(trials), 3)
        codes = sorted({_blame(t) for t in failed})
        if failed and not any(f.code in codes for f in self.findings):
            fixed = f" with --fix {self.fix}" if self.fix != "none" else ""
            title = f"Threads sharing one triton autotuner failed in {len(failed)} of {len(trials)} {what}{fixed}"
            raced = [t for t in failed if _blame(t) == "autotuner-race"]
            self._failure((raced or failed)[0], title, failures=(len(failed), len(trials), what))
        overlapped = [t for t in trials if t["concurrent_entries"] and not t["failed"]]
        if overlapped and self.fix == "none":
            self._overlap_finding(overlapped, len(trials))
        equal = all(t["outputs_equal"] is not False for t in trials)
        self._check(
            name,
            "fail" if failed else "pass",
            f"{len(failed)} of {len(trials)} {what} failed with --fix {self.fix}"
            + ("; outputs equal to single-threaded runs" if equal and not failed else ""),
            *codes,
        )

    def _reached(self, trials: list[KernelTrialRecord]) -> None:
        """The inventory that matters: the autotuned kernels the workload's calls really reached."""
        reached = sorted({kernel for t in trials for kernel in t.get("autotuners_entered", [])})
        self.measurements["autotuners_reached"] = reached
        if reached:
            self._check(
                "autotuners reached",
                "info",
                f"{len(reached)} shared autotuned kernels on the workload's path: {', '.join(reached)}",
            )

    def _cold_tuning(self, trials: list[KernelTrialRecord]) -> None:
        """A trial only tests the race if it tuned cold: no tuning result may have come from disk, and
        (trials sharing a host) every kernel it called with configs to choose from benchmarked them."""
        stored = max((t.get("tuning_results_on_disk", 0) for t in trials), default=0)
        warm = sorted({name for t in trials for name in t.get("entered_warm", [])})
        hosts = sum(1 for t in trials if t.get("fresh_process", True))
        problems = []
        if stored:
            problems.append(
                f"{stored} tuning results were written to the trials' TRITON_CACHE_DIR, so later trials may have "
                "read them instead of tuning"
            )
        if warm:
            problems.append(f"{', '.join(warm)} ran without benchmarking its configs: its choice was not tuned cold")
        processes = f"{hosts} process{'es' if hosts != 1 else ''}"
        cleared = sum(t.get("tuning_entries_cleared", 0) for t in trials)
        self.measurements.update(trial_processes=hosts, tuning_entries_cleared=cleared)
        self._check(
            "cold tuning",
            "warn" if problems else "pass",
            "; ".join(problems)
            if problems
            else f"no tuning result on disk, every tuner emptied before each trial ({cleared} entries from earlier "
            f"trials cleared): {len(trials)} trial{'s' if len(trials) != 1 else ''} tuned every key, in {processes}",
        )

    def _reference(self, reference: ReferenceTarget) -> None:
        """The reference pairs' target: it only tests the race if its layers reach FLA's autotuners."""
        self.measurements["reference"] = reference
        impl = reference["linear_attention"] or "no gated DeltaNet layer"
        kinds = reference["layer_types"]
        linear = sum(kind == "linear_attention" for kind in kinds)
        self._check(
            "reference setup",
            "pass" if impl.startswith("fla") else "warn",
            f"{reference['switch']}; each pair's target: {linear} of {len(kinds)} layers gated DeltaNet via "
            f"{impl}, {reference['tokens']} tokens",
        )

    def _processes(self, run: ProcessesRecord) -> None:
        self.measurements["processes"] = run
        shared = run["distinct_processes"] < run["world"]
        ok = run["failures"] == 0 and not shared
        self._check(
            "processes",
            "pass" if ok else "fail",
            f"{run['world']} ranks over {run['backend']} in {run['distinct_processes']} processes, each with its own "
            f"autotuner: {run['failures']} failures" + ("; outputs equal to a single-process run" if ok else ""),
        )

    def _overlap_finding(self, overlapped: list[TrialRecord], trials: int) -> None:
        """Threads were inside one autotuner together in runs that happened not to crash."""
        event = overlapped[0]["concurrent_entries"][0]
        self.findings.append(
            finding(
                "concurrent-autotuner-entry",
                f"Two threads were inside autotuner `{event['kernel']}` at once in {len(overlapped)} of {trials} "
                "runs that did not crash",
                detail=f"{event['threads'][1]} entered while {event['threads'][0]} was inside. A run that does "
                "not crash proves nothing: the same overlap crashes or corrupts when it lands during tuning.",
                evidence={"event": event, "runs_with_overlap": len(overlapped)},
                fix=FIX_ADVICE,
                refs=REFS,
            )
        )

    @staticmethod
    def _trial_summary(trial: TrialRecord) -> str:
        if trial["errors"]:
            first = trial["errors"][0]
            return f"{len(trial['errors'])} of {trial['threads']} threads raised {first['type']}: {first['message']}"
        equal = "outputs equal to a single-threaded run" if trial["outputs_equal"] else "outputs differ"
        return f"0 of {trial['threads']} threads failed, {equal} ({trial['duration_s']} s)"

    def _failure(self, trial: TrialRecord, title: str, failures: tuple[int, int, str] | None = None) -> str:
        """The finding for a failed trial, by where it failed; its code."""
        code = _blame(trial)
        if code == "autotuner-race":
            self._race_finding(trial, title)
        else:
            self._target_finding(trial, failures)
        return code

    def _target_finding(self, trial: TrialRecord, failures: tuple[int, int, str] | None) -> None:
        """A failure no autotuner took part in: the target's own error, named as such."""
        error = trial["errors"][0] if trial["errors"] else None
        how = f"{error['type']}: {error['message']}" if error else "its outputs differ from a single-threaded run"
        many = f" in {failures[0]} of {failures[1]} {failures[2]}" if failures else ""
        self.findings.append(
            finding(
                "target-raised",
                f"The race workload failed{many} outside any triton autotuner: {how}"[:300],
                detail="No thread was inside an autotuner when it failed and no two threads met in one, so this is "
                "not the autotuner race: it is the workload's own "
                + ("error" if error else "nondeterminism under threads")
                + (f", raised at {error['frame']}." if error and error["frame"] else "."),
                where=frame_where(error["frame"]) if error else None,
                evidence={"errors": trial["errors"][:4], "outputs_equal": trial["outputs_equal"]},
                fix="Call the target once by itself, as the race calls it (`fn(worker, device)`), and fix that; "
                "then run race again.",
            )
        )

    def _race_finding(self, trial: TrialRecord, title: str) -> None:
        error = trial["errors"][0] if trial["errors"] else None
        stacks = {e["thread"]: e["traceback"] for e in trial["errors"]}
        for entry in trial["concurrent_entries"]:
            for thread, stack in zip(entry["threads"], entry["stacks"], strict=False):
                stacks.setdefault(thread, "\n".join(stack))
        kernel, launch = (error.get("kernel"), error.get("launch_site")) if error else (None, None)
        if kernel:
            title += f" (`{kernel}`)"
        detail = (
            f"{error['type']}: {error['message']} in {error['frame']}"
            + (f", inside `{kernel}` launched at {launch}" if kernel and launch else "")
            + ". "
            if error
            else "No thread raised, but the outputs differ from a single-threaded run. "
        )
        detail += (
            f"{trial['threads']} threads called one autotuned kernel at once "
            f"({'interleaving forced' if trial['forced'] else 'unforced'}, fix {trial['fix']}); "
            "triton's Autotuner.run keeps `nargs` on the shared instance and sets it to None when a call ends, "
            "so a thread still benchmarking reads the other thread's None."
        )
        if error and trial["outputs_equal"] is False:
            detail += " A thread that did not raise returned an output that differs from a single-threaded run."
        self.findings.append(
            finding(
                "autotuner-race",
                title,
                detail=detail,
                where=frame_where(launch or error["frame"]) if error else None,
                evidence={
                    "exception": f"{error['type']}: {error['message']}" if error else None,
                    "failing_frame": error["frame"] if error else None,
                    "kernel": kernel,
                    "launch_site": launch,
                    "stacks": stacks,
                    "concurrent_entries": trial["concurrent_entries"],
                    "versions": {
                        "triton": self.observations.triton,
                        "torch": self.observations.torch,
                        "fla": self.observations.fla,
                        "python": self.observations.python,
                    },
                },
                fix=FIX_ADVICE,
                refs=REFS,
            )
        )


def _blame(trial: TrialRecord) -> str:
    """`autotuner-race` only when the failure was inside an autotuner (a thread's exception passed
    through one, or its traceback through triton's autotuner module) or the guard saw two threads in
    one autotuner; anything else is the target's own (`target-raised`)."""
    inside = any(
        error.get("kernel") or "triton/runtime/autotuner.py" in (error.get("traceback") or "")
        for error in trial["errors"]
    )
    return "autotuner-race" if inside or trial["concurrent_entries"] else "target-raised"


def judge(observations: RaceObservations, budgets: Budgets) -> list[ProbeResult]:
    return [RaceJudge(observations, budgets).judge()]
