"""What a run is held to. Every judge takes one `Budgets`: a command alone uses the defaults, and
the gate passes the team's (`[tool.dflashdoctor]`), so a verdict is made once, by the judge, and
never edited afterwards.

Each default is defined here and nowhere else; the commands' options and the gate's configuration
read them from this class.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Budgets:
    max_recompiles: int = 2  # check-compile's varying lengths: more is a `recompiles` warning
    max_graph_breaks: int = 0
    max_compile_seconds: float | None = None  # None: compile time is not budgeted
    require_fused_backward: bool = True  # false: a dense backward is accepted (a forward-only job)
    threaded_autotuners: bool = False  # the pipeline runs autotuned kernels from several threads at once
    # True when the gate holds a pipeline to these: each overrun (recompiles, graph breaks, compile
    # seconds) is a `budget-exceeded` error, and the race is judged for the pipeline. A command run
    # alone reports the same figures with its own warnings.
    held_by_gate: bool = False
