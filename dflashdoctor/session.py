"""Building a Report around probe runs: environment, timing, and crashes turned into findings."""

from __future__ import annotations

import copy
import platform
import re
import sys
import time
from datetime import UTC, datetime
from typing import Any

from dflashdoctor import __version__
from dflashdoctor.budgets import Budgets
from dflashdoctor.codes import finding
from dflashdoctor.errors import BadInput, MissingPackage
from dflashdoctor.judges.leftovers import left_running_finding
from dflashdoctor.observations import ObservationsError, load
from dflashdoctor.probe_configs import ProbeConfig
from dflashdoctor.probe_spec import ProbeSpec
from dflashdoctor.probe_support import missing_package
from dflashdoctor.redaction import redact_argv, redact_text
from dflashdoctor.remote import SshTarget
from dflashdoctor.report import ProbeResult, Report
from dflashdoctor.runner import ProbeRun, resolve_python, run_probe

PROBE_TIMEOUT_S = 900.0  # a probe that runs longer is stopped, its stacks taken (check-compile, trace-attention)

# What every probe says about the interpreter it ran in (the doctor's own Python may differ).
_PROBED_ENVIRONMENT = ("python", "torch", "transformers", "device", "device_name")


def new_report(command: str, argv: list[str]) -> Report:
    return Report(
        command=command,
        argv=redact_argv(argv),  # a token on the command line is kept by no report
        started=datetime.now(UTC).isoformat(timespec="seconds"),
        environment={
            "dflashdoctor": __version__,
            "doctor_python": sys.version.split()[0],
            "platform": platform.platform(),
        },
    )


def run_probe_command(spec: ProbeSpec, options: Any, argv: list[str], budgets: Budgets | None = None) -> Report:
    """Any probe command from its spec: bad input said first, then the probe in the probed interpreter
    (`options.python`, `options.ssh`), judged against `budgets` (the gate's) or the spec's own, into
    a report of its own."""
    if spec.command is not None:
        return spec.command(options, argv, budgets)
    assert spec.probe_config is not None, f"{spec.name} has neither a probe config nor a command"
    spec.validate(options)
    python = probe_python(options.python, options.ssh)
    started = time.monotonic()
    report = new_report(spec.name, argv)
    report.environment.update(spec.subject(options))
    probe_into_report(
        report,
        spec,
        spec.probe_config(options),
        python=python,
        timeout_s=options.timeout_s,
        budgets=budgets or spec.budgets(options),
        env=spec.variables(options),
        ssh=options.ssh,
    )
    return finish(report, started)


def finish(report: Report, started_monotonic: float) -> Report:
    report.duration_s = round(time.monotonic() - started_monotonic, 3)
    report.settle_verdict()
    return report


def crash_result(run: ProbeRun) -> ProbeResult:
    """A probe that died without a result: one probe-crashed finding carrying what it left behind."""
    return ProbeResult(
        probe=run.probe,
        status="error",
        duration_s=run.duration_s,
        findings=[
            finding(
                "probe-crashed",
                run.crash_summary(),
                detail="The probe process ended without writing its result. Its last output is in the "
                "evidence; on a timeout the stderr tail holds every thread's stack.",
                evidence={
                    "returncode": run.returncode,
                    "timed_out": run.timed_out,
                    # a traceback the probe's target printed may quote a secret
                    "stderr_tail": redact_text(run.stderr_tail),
                    "stdout_tail": redact_text(run.stdout_tail),
                    "argv": run.argv,
                },
                fix="Raise --timeout if the probe was only slow; otherwise run the argv above by hand to reproduce.",
            )
        ],
    )


_NO_MODULE = re.compile(r"^ModuleNotFoundError: No module named '([^']+)'$")


def probe_payload(run: ProbeRun, python: str) -> dict[str, Any] | None:
    """The probe's observations; a usage error found on the probed side becomes BadInput. A probe that
    died importing torch (or another package it needs) before it could say so is bad input too: the
    interpreter given with --python lacks it."""
    if run.payload is None:
        lines = (run.stderr_tail or "").strip().splitlines()
        match = _NO_MODULE.match(lines[-1]) if lines and not run.timed_out else None
        missing = missing_package(ModuleNotFoundError(name=match[1]), python) if match else None
        if missing is not None:
            raise MissingPackage(missing.package, str(missing))
        return None
    if "missing_package" in run.payload:
        raise MissingPackage(run.payload["missing_package"], run.payload["usage_error"])
    if "usage_error" in run.payload:
        raise BadInput(run.payload["usage_error"])
    return run.payload


def probe_error_result(run: ProbeRun, payload: dict[str, Any]) -> ProbeResult:
    """The probe caught its own failure: report it as a crash of that probe, with the traceback."""
    result = crash_result(run)
    crash = result.findings[0]
    crash.title = f"probe {run.probe} failed: {payload['probe_error']}"
    crash.detail = "The probe itself raised before it could finish; its traceback is in the evidence."
    crash.fix = "This is a dflashdoctor bug: report it with the traceback and the argv in the evidence."
    crash.evidence["traceback"] = payload.get("traceback", "")
    return result


def probe_python(python: str | None, ssh: str | None = None) -> str:
    """The interpreter to probe with, or BadInput naming the one that is missing. On another machine
    (`ssh`) it is that machine's `python3` unless named, and is not looked for here."""
    if ssh is not None:
        return python or "python3"
    try:
        return resolve_python(python)
    except ValueError as exc:
        raise BadInput(str(exc)) from exc


def probe_into_report(
    report: Report,
    spec: ProbeSpec,
    config: ProbeConfig,
    *,
    python: str,
    timeout_s: float,
    budgets: Budgets,
    env: dict[str, str] | None = None,
    ssh: str | None = None,
) -> None:
    """Run one probe, keep its observations, and append its judged sections (or its crash) to the
    report. The probed interpreter's versions and device go into the report's environment."""
    assert spec.script is not None, f"{spec.name} has no probe script"
    target = SshTarget.parse(ssh) if ssh is not None else None
    run = run_probe(
        spec.name,
        spec.script,
        config,
        python=python,
        timeout_s=timeout_s,
        env=env,
        ssh=target,
        forkable=spec.forked_in_gate,
    )
    if target is not None:
        report.environment["probed_host"] = ssh
    payload = probe_payload(run, python)
    results = _judged(run, spec, payload, budgets)
    if run.left_running:  # what the target or script started outlived the probe: it was stopped
        results[0].findings.append(left_running_finding(run.left_running, f"probe {spec.name}"))
    report.results.extend(results)
    if payload is not None:
        report.observations[spec.name] = payload
        report.environment.update({k: payload[k] for k in _PROBED_ENVIRONMENT if payload.get(k) is not None})


def _judged(run: ProbeRun, spec: ProbeSpec, payload: dict[str, Any] | None, budgets: Budgets) -> list[ProbeResult]:
    """The probe's sections: its judge's, or one crash section when it wrote nothing its judge can read."""
    if payload is None:
        return [crash_result(run)]
    if "probe_error" in payload:
        return [probe_error_result(run, payload)]
    try:
        # strict: the probe is this version's own (the runner sends it), so a key it wrote that the
        # judge does not know, or one missing, is our bug, said as one, never judged on a default
        # from a copy: what a judge does to its records must not change what the report keeps
        # the spec's class, which only its judge knows
        observations: object = load(spec.observations, copy.deepcopy(payload), strict=True)
    except ObservationsError as exc:  # the probe wrote something its judge cannot read: our bug
        return [probe_error_result(run, {"probe_error": f"unreadable observations: {exc}"})]
    results = spec.judge(observations, budgets)
    results[0].duration_s = run.duration_s
    return results
