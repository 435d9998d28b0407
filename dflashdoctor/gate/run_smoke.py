"""The gate's `run` section: the team's own training command under `run`'s agent, each process
stopped after a few optimizer steps, judged against the gate's budgets.

The probes predict; this sees. A dense backward reached only through the real training step, the
hidden flex path inside the team's model, two data-parallel pairs on threads entering one autotuner:
each is found where it happens. So a `concurrent-autotuner-entry` seen here is an error whatever
`threaded_autotuners` says (that budget excuses a prediction, not an observation); run's judge
never consults it.

It runs after the probes, not beside them. Beside them the gate would end sooner (measured on the
2-core CPU: docs/commands/gate.md), but the probes' figures would be taken with a trainer competing
for the same CPUs and GPU, and those figures are judged (check-compile's compile seconds against
`max_compile_seconds`). Its events go to a private temporary folder, removed after judging (by
`run`'s launcher, also when the doctor is killed with SIGKILL); what the report needs is in the
report. A gate stopped mid-run (SIGTERM, Ctrl-C) stops the trainer and exits as it does during its
probes (143, 130), with no report.

Each node runs the smoke on its own, in the single-node form of the command (torchrun's options
that join nodes dropped, `--standalone` added): gating one node must not wait for the others. On
several nodes each runs it in the same folder as here (a cluster's shared filesystem):
probes/run_smoke.py there, judged there with these budgets, the report sent back. judges/nodes.py
then names a node whose run failed, ran a site dense, or stepped far slower than the others.
"""

from __future__ import annotations

import os
import shlex
import shutil
import tempfile
from pathlib import Path

from dflashdoctor.budgets import Budgets
from dflashdoctor.commands.run import RunOptions, run
from dflashdoctor.errors import BadInput
from dflashdoctor.probe_configs import RunSmokeConfig
from dflashdoctor.remote import SshTarget
from dflashdoctor.report import Report
from dflashdoctor.runner import run_probe
from dflashdoctor.session import crash_result, new_report, probe_error_result, probe_payload

_LAUNCHERS = ("torchrun", "torch.distributed.run", "torch.distributed.launch")
# torchrun's options that join this node to others, each followed by its value
_JOINING = {
    "--nnodes", "--node-rank", "--node_rank", "--rdzv-endpoint", "--rdzv_endpoint", "--rdzv-backend",
    "--rdzv_backend", "--rdzv-id", "--rdzv_id", "--rdzv-conf", "--rdzv_conf", "--master-addr",
    "--master_addr", "--master-port", "--master_port", "--local-addr", "--local_addr",
}  # fmt: skip
# torchrun's options that take no value (and torch.distributed.launch's --use-env); every other
# option before the script takes one
_FLAGS = {
    "--standalone", "-m", "--module", "--no-python", "--no_python", "--run-path", "--run_path",
    "--use-env", "--use_env",
}  # fmt: skip
_START_S = 120.0  # beyond run_timeout on another node: ssh, unpacking the package, starting Python


def run_command(spec: str | list[str]) -> list[str]:
    """The command as a list: a string is split as a shell would (quotes kept together); a list is
    taken as it is. Empty is bad input."""
    if isinstance(spec, str):
        try:
            words = shlex.split(spec)
        except ValueError as exc:  # an unclosed quote
            raise BadInput(f"run {spec!r} cannot be split as a shell would: {exc}") from None
    else:
        words = list(spec)
    if not words or any(not isinstance(word, str) or "\0" in word for word in words):
        raise BadInput("run must name a command: a string such as 'python train.py --max-steps 5', or a list of words")
    return words


def run_section(command: list[str], steps: int, timeout_s: float, budgets: Budgets, argv: list[str]) -> Report:
    """`run --steps STEPS` of the command, its stdout on stderr (the gate's stdout may be its JSON
    report), stopped with every thread's stack taken at `timeout_s` (`run-timeout`)."""
    folder = Path(tempfile.mkdtemp(prefix="dflashdoctor-gate-run-"))
    try:
        options = RunOptions(
            command=command,
            report_dir=folder,
            hang_timeout_s=timeout_s,
            deadline_s=timeout_s,
            steps=steps,
            stdout_to_stderr=True,
            temporary=True,
            passes_interrupt=True,
        )
        return run(options, argv, budgets)
    finally:  # bad input before the command started leaves it to this
        shutil.rmtree(folder, ignore_errors=True)


def _launcher_end(words: list[str]) -> int | None:
    """Where torchrun's own options start (after `torchrun`, or `python -m torch.distributed.run`);
    None for a command that is not torchrun."""
    if Path(words[0]).name == "torchrun":
        return 1
    for i, word in enumerate(words[:-1]):
        if word == "-m" and words[i + 1] in _LAUNCHERS:
            return i + 2
    return None


def single_node_form(words: list[str]) -> list[str]:
    """The command as one node runs it alone: torchrun's options that join nodes (`--nnodes 2`,
    `--node-rank`, `--rdzv-*`, `--master-*`) dropped up to the script, and `--standalone` added
    where it is missing. Other commands are taken as they are: they are the user's single-node form."""
    start = _launcher_end(words)
    if start is None:
        return list(words)
    kept, i = list(words[:start]), start
    while i < len(words) and words[i].startswith("-") and words[i] != "--":  # `--`: the script follows
        name = words[i].split("=", 1)[0]
        takes_value = name not in _FLAGS and "=" not in words[i]
        if name not in _JOINING:
            kept.extend(words[i : i + 1 + takes_value])
        i += 1 + takes_value
    if "--standalone" not in kept[start:]:
        kept.insert(start, "--standalone")
    return [*kept, *words[i:]]


def remote_run_section(
    command: list[str], steps: int, timeout_s: float, budgets: Budgets, argv: list[str], ssh: str, python: str
) -> Report:
    """The smoke on another node (probes/run_smoke.py), in this folder there; judged there with these
    budgets by this same package, which travels with the probe. A node where it cannot start is the
    node's finding, as for any probe."""
    config = RunSmokeConfig(
        command=command, steps=steps, timeout_s=timeout_s, budgets=budgets, cwd=os.getcwd(), argv=argv
    )
    probe = run_probe(
        "run", "run_smoke.py", config, python=python, timeout_s=timeout_s + _START_S, ssh=SshTarget.parse(ssh)
    )
    payload = probe_payload(probe, python)
    report = new_report("gate", argv)
    if payload is None:
        report.results.append(crash_result(probe))
        return report
    if "probe_error" not in payload:
        try:
            report.results = Report.from_dict(payload["report"]).results
        except (KeyError, TypeError, ValueError, AttributeError) as exc:  # our own bug: said as a crash
            payload = {"probe_error": f"unreadable run report: {exc!r}"}
    if "probe_error" in payload:
        report.results.append(probe_error_result(probe, payload))
        return report
    observations = payload.get("observations")
    if isinstance(observations, dict):  # by probe name, as the node's own report kept them
        report.observations.update(observations)
    return report
