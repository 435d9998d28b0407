"""Probe: the gate's `run` section on another node: the team's command under `run`'s agent, in the
folder the gate was started in (the cluster's shared filesystem), judged here with the gate's budgets
by the package that travelled with this probe; the report goes back whole.
"""

from __future__ import annotations

import os
from typing import Any

from dflashdoctor.gate.run_smoke import run_section
from dflashdoctor.probe_configs import RunSmokeConfig
from dflashdoctor.probe_support import UsageError, probe_main


def run(config: RunSmokeConfig) -> dict[str, Any]:
    folder = config.cwd
    try:
        os.chdir(folder)
    except OSError as exc:
        raise UsageError(
            f"run in the gate starts the command in {folder!r} on every node, and this node has no such folder "
            f"({exc.strerror}): gate from a folder the nodes share"
        ) from None
    report = run_section(config.command, config.steps, config.timeout_s, config.budgets, config.argv)
    return {"report": report.to_dict(), "observations": report.observations}


if __name__ == "__main__":
    probe_main(run, RunSmokeConfig)
