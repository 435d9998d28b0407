"""The gate's configuration: each probe's own Options, the budgets, and the few settings that are
the gate's alone. It restates no probe option and no default: a probe's options here are its
command's Options dataclass, built with that dataclass's defaults, and the gate's table
(gate/table.py) sets only the fields it names. So a default changed in a command is the gate's too.

A setting the gate applies to every probe (`device`, `timeout`) is a key of the table that fills its
field in every probe's Options that has one (`timeout`: `timeout_s`), not a field here."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from dflashdoctor.budgets import Budgets
from dflashdoctor.commands.cache import CacheOptions
from dflashdoctor.commands.check_compile import CheckCompileOptions
from dflashdoctor.commands.env import EnvOptions
from dflashdoctor.commands.race import RaceOptions
from dflashdoctor.commands.trace_attention import TraceAttentionOptions
from dflashdoctor.errors import BadInput
from dflashdoctor.gate.hostfile import MAX_NODES
from dflashdoctor.gate.nodes import NODES_IN_FLIGHT
from dflashdoctor.gate.run_smoke import run_command
from dflashdoctor.limits import MAX_STEPS, MAX_VARY, count_problem, seconds_problem
from dflashdoctor.session import PROBE_TIMEOUT_S
from dflashdoctor.shapes import DEVICES, DTYPES, MASKS, OPTION_FIELDS

# The probes the gate runs, in the order of its report; `run` runs after them when configured.
GATE_PROBES = ("env", "check-compile", "trace-attention", "race", "cache")
SHAPE_KEYS = tuple(f.name for f in OPTION_FIELDS)  # check-compile's shape options

ProbeOptions = EnvOptions | CheckCompileOptions | TraceAttentionOptions | RaceOptions | CacheOptions


def options_field(probe: str) -> str:
    """The GateConfig field that holds `probe`'s options: its name, as an identifier."""
    return probe.replace("-", "_")


def _gate_budgets() -> Budgets:
    return Budgets(held_by_gate=True)


@dataclass
class GateConfig:
    """What the gate runs and holds it to. The table's `timeout` is each probe's `timeout_s`; left out,
    each probe keeps its command's own (env's is short), and each section records the one it ran
    with. `cache check` on this machine scans in the gate's own process, as its command does: its
    timeout holds only where it runs as a probe, over ssh. `run` has its own, `run_timeout`."""

    # Each probe's options, with its command's defaults where the table names no field of them.
    env: EnvOptions = field(default_factory=EnvOptions)
    check_compile: CheckCompileOptions = field(default_factory=CheckCompileOptions)
    trace_attention: TraceAttentionOptions = field(default_factory=TraceAttentionOptions)
    race: RaceOptions = field(default_factory=RaceOptions)
    cache: CacheOptions = field(default_factory=CacheOptions)
    # What every probe of the gate, and `run`, is judged against: the team's, held by the gate.
    budgets: Budgets = field(default_factory=_gate_budgets)
    # The team's training command under `run` (a string split as a shell would, or a list of words):
    # each process stopped after run_steps optimizer steps, all of it after run_timeout seconds. A
    # smoke of a few steps, not the probes' `timeout`: a trainer's start is not a probe's.
    run: str | list[str] | None = None
    run_steps: int = 3
    run_timeout: float = PROBE_TIMEOUT_S
    probes: list[str] = field(default_factory=lambda: list(GATE_PROBES))
    parallel: bool = True  # run the probes at once; false for timings on an otherwise idle machine
    nodes_in_flight: int = NODES_IN_FLIGHT  # with several nodes: gated at once
    # Paths (relative to this file's folder) whose code the gate may run although another user owns
    # them or could change them (trust.py); read only from a configuration that is itself trusted.
    trust: list[str] = field(default_factory=list)

    def options(self) -> dict[str, ProbeOptions]:
        """Each probe's options by the probe's name, as configured (no interpreter, no host yet)."""
        return {
            "env": self.env,
            "check-compile": self.check_compile,
            "trace-attention": self.trace_attention,
            "race": self.race,
            "cache": self.cache,
        }

    def probe_options(self, name: str, python: str | None, ssh: str | None) -> ProbeOptions:
        """The options probe `name` runs with on one machine (`python` there, `ssh` to reach it).
        trace-attention traces the team's step script, else the configured model, else the reference
        drafter step (where its command alone would trace its default model preset)."""
        options = replace(self.options()[name], python=python, ssh=ssh)
        if isinstance(options, TraceAttentionOptions):
            options = replace(options, drafter=options.model is None and options.script is None)
        return options

    def validate(self) -> None:
        """Everything that can be checked before minutes of probing are spent, named by the table's keys."""
        if any(not isinstance(path, str) or not path or "\0" in path for path in self.trust):
            raise BadInput("trust must be a list of paths (strings)")
        unknown = [p for p in self.probes if not isinstance(p, str) or p not in GATE_PROBES]
        if unknown:
            raise BadInput(f"unknown probe {unknown[0]!r} in probes; expected some of {', '.join(GATE_PROBES)}")
        if not self.probes:
            raise BadInput(f"probes is empty: name at least one of {', '.join(GATE_PROBES)}")
        compiled = self.check_compile
        if compiled.device not in DEVICES:
            raise BadInput(f"unknown device {compiled.device!r}; expected one of {', '.join(DEVICES)}")
        if compiled.mask not in MASKS:
            raise BadInput(f"unknown mask {compiled.mask!r}; expected one of {', '.join(MASKS)}")
        for spec, name in ((compiled.target, "target"), (self.trace_attention.expect_wrapper, "expect_wrapper")):
            if spec is not None and ":" not in spec:
                raise BadInput(f"{name} {spec!r} is not of the form package.module:attr or path/to/file.py:attr")
        if self.run is not None:
            run_command(self.run)
        self._validate_shape()
        budgets = self.budgets
        problems = [
            count_problem(compiled.vary, "vary", 0, MAX_VARY),
            count_problem(budgets.max_recompiles, "max_recompiles", 0),
            count_problem(budgets.max_graph_breaks, "max_graph_breaks", 0),
            count_problem(self.nodes_in_flight, "nodes_in_flight", 1, MAX_NODES),
            count_problem(self.run_steps, "run_steps", 1, MAX_STEPS),
            *(seconds_problem(options.timeout_s, "timeout") for options in self.options().values()),
            seconds_problem(self.run_timeout, "run_timeout"),
            None
            if budgets.max_compile_seconds is None
            else seconds_problem(
                budgets.max_compile_seconds, "max_compile_seconds", zero_means="allows no compile time"
            ),
        ]
        problem = next((p for p in problems if p), None)
        if problem:
            raise BadInput(problem)

    def _validate_shape(self) -> None:
        for key, value in self.check_compile.shape.items():
            if key not in SHAPE_KEYS:
                raise BadInput(f"unknown key {key!r} in shape; known keys: {', '.join(SHAPE_KEYS)}")
            if key == "dtype":
                if value not in DTYPES:
                    raise BadInput(f"shape.dtype {value!r} is not one of {', '.join(DTYPES)}")
            elif count_problem(value, f"shape.{key}", 1):
                raise BadInput(count_problem(value, f"shape.{key}", 1))
