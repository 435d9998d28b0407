"""What defines a probe, in one record: its options (and so its defaults), what it observes, how it
is judged, the script the probed interpreter runs, and what it needs there.

Each command module declares its `SPEC`; `registry.PROBES` collects them. The CLI, the gate and the
runner read a probe from there, so adding a probe is one command module, one probe script, one
observations class and one judge, wired in one visible place.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dflashdoctor.budgets import Budgets
from dflashdoctor.report import ProbeResult, Report


@dataclass(frozen=True)
class ProbeSpec:
    name: str
    options: type  # the command's options dataclass: every default of the probe lives there
    observations: type  # what the probe reports (observations.py), loaded before judging
    judge: Callable[[Any, Budgets], list[ProbeResult]]
    command: Callable[[Any, list[str], Budgets], Report]  # options, argv, budgets -> the probe's own report
    script: str | None  # probes/<script> in the probed interpreter; None: the doctor's side does the work
    # The gate's configuration, the probed interpreter (--python) and machine (--ssh) -> options.
    from_gate: Callable[[Any, str | None, str | None], Any] | None = None
    # packages whose absence there means the probe does not apply, and why
    skipped_without: dict[str, str] = field(default_factory=dict)
    # run here by the gate, it is forked from the probe host (forkserver/): it imports torch, and sets
    # no environment variable that torch or triton would read at import (server.READ_WHEN_USED)
    forked_in_gate: bool = False
