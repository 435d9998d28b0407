"""The gate's configuration: `[tool.dflashdoctor]` in pyproject.toml, or dflashdoctor.toml, or a file
given with --config. An unknown key or a value of the wrong type is bad input (exit 2): a typo in a
budget must never pass silently."""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from dflashdoctor.budgets import Budgets
from dflashdoctor.commands.check_compile import CheckCompileOptions
from dflashdoctor.errors import BadInput
from dflashdoctor.gate.hostfile import MAX_NODES
from dflashdoctor.gate.nodes import NODES_IN_FLIGHT
from dflashdoctor.gate.run_smoke import run_command
from dflashdoctor.limits import MAX_STEPS, MAX_VARY, count_problem, seconds_problem
from dflashdoctor.placed_files import MIB, PlacedFileError, read_placed
from dflashdoctor.safe_fs import user_name
from dflashdoctor.session import PROBE_TIMEOUT_S
from dflashdoctor.shapes import DEVICES, DTYPES, MASKS, OPTION_FIELDS
from dflashdoctor.trust import Trust

# The probes the gate runs, in the order of its report (gate/probe_options.py maps the configuration
# to each one's options); `run` runs after them when configured.
GATE_PROBES = ("env", "check-compile", "trace-attention", "race", "cache")
SHAPE_KEYS = tuple(f.name for f in OPTION_FIELDS)  # check-compile's shape options


@dataclass
class GateConfig:
    target: str = CheckCompileOptions.target  # the flex_attention wrapper check-compile judges
    device: str = CheckCompileOptions.device
    shape: dict[str, Any] = field(default_factory=dict)  # check-compile's shape; unset keys: the device's default
    mask: str = CheckCompileOptions.mask  # check-compile's mask: dflash, causal or none
    vary: int = CheckCompileOptions.vary  # check-compile: this many more context lengths
    model: str | None = None  # a trace-attention model preset; None traces the reference drafter step
    script: str | None = None  # trace-attention runs the team's own step (a Python file) instead
    expect_wrapper: str | None = None  # trace-attention: every flex call must go through this
    # The team's training command under `run` (a string split as a shell would, or a list of words):
    # each process stopped after run_steps optimizer steps, all of it after run_timeout seconds.
    run: str | list[str] | None = None
    run_steps: int = 3
    run_timeout: float = PROBE_TIMEOUT_S
    probes: list[str] = field(default_factory=lambda: list(GATE_PROBES))
    max_recompiles: int = Budgets.max_recompiles
    max_graph_breaks: int = Budgets.max_graph_breaks
    require_fused_backward: bool = Budgets.require_fused_backward
    max_compile_seconds: float | None = Budgets.max_compile_seconds
    threaded_autotuners: bool = Budgets.threaded_autotuners
    triton_dir: str | None = None
    inductor_dir: str | None = None
    timeout: float = PROBE_TIMEOUT_S
    parallel: bool = True  # run the probes at once; false for timings on an otherwise idle machine
    nodes_in_flight: int = NODES_IN_FLIGHT  # with several nodes: gated at once
    # Paths (relative to this file's folder) whose code the gate may run although another user owns
    # them or could change them (trust.py); read only from a configuration that is itself trusted.
    trust: list[str] = field(default_factory=list)

    def budgets(self) -> Budgets:
        """What every probe of the gate is judged against."""
        return Budgets(
            max_recompiles=self.max_recompiles,
            max_graph_breaks=self.max_graph_breaks,
            max_compile_seconds=self.max_compile_seconds,
            require_fused_backward=self.require_fused_backward,
            threaded_autotuners=self.threaded_autotuners,
            held_by_gate=True,
        )

    def validate(self) -> None:
        """Everything that can be checked before minutes of probing are spent."""
        if any(not isinstance(path, str) or not path or "\0" in path for path in self.trust):
            raise BadInput("trust must be a list of paths (strings)")
        unknown = [p for p in self.probes if not isinstance(p, str) or p not in GATE_PROBES]
        if unknown:
            raise BadInput(f"unknown probe {unknown[0]!r} in probes; expected some of {', '.join(GATE_PROBES)}")
        if not self.probes:
            raise BadInput(f"probes is empty: name at least one of {', '.join(GATE_PROBES)}")
        if self.device not in DEVICES:
            raise BadInput(f"unknown device {self.device!r}; expected one of {', '.join(DEVICES)}")
        if self.mask not in MASKS:
            raise BadInput(f"unknown mask {self.mask!r}; expected one of {', '.join(MASKS)}")
        for spec, name in ((self.target, "target"), (self.expect_wrapper, "expect_wrapper")):
            if spec is not None and ":" not in spec:
                raise BadInput(f"{name} {spec!r} is not of the form package.module:attr or path/to/file.py:attr")
        if self.run is not None:
            run_command(self.run)
        self._validate_shape()
        problems = [
            count_problem(self.vary, "vary", 0, MAX_VARY),
            count_problem(self.max_recompiles, "max_recompiles", 0),
            count_problem(self.max_graph_breaks, "max_graph_breaks", 0),
            count_problem(self.nodes_in_flight, "nodes_in_flight", 1, MAX_NODES),
            count_problem(self.run_steps, "run_steps", 1, MAX_STEPS),
            seconds_problem(self.timeout, "timeout"),
            seconds_problem(self.run_timeout, "run_timeout"),
            None
            if self.max_compile_seconds is None
            else seconds_problem(self.max_compile_seconds, "max_compile_seconds", zero_means="allows no compile time"),
        ]
        problem = next((p for p in problems if p), None)
        if problem:
            raise BadInput(problem)

    def _validate_shape(self) -> None:
        for key, value in self.shape.items():
            if key not in SHAPE_KEYS:
                raise BadInput(f"unknown key {key!r} in shape; known keys: {', '.join(SHAPE_KEYS)}")
            if key == "dtype":
                if value not in DTYPES:
                    raise BadInput(f"shape.dtype {value!r} is not one of {', '.join(DTYPES)}")
            elif count_problem(value, f"shape.{key}", 1):
                raise BadInput(count_problem(value, f"shape.{key}", 1))


_TYPES = {
    "str": (str,),
    "str | None": (str, type(None)),
    "int": (int,),
    "float": (int, float),
    "float | None": (int, float, type(None)),
    "bool": (bool,),
    "list[str]": (list,),
    "str | list[str] | None": (str, list, type(None)),
    "dict[str, Any]": (dict,),
}


def _from_table(table: dict[str, Any], source: str) -> GateConfig:
    known = {f.name: f for f in fields(GateConfig)}
    values = {}
    for key, value in table.items():
        name = key.replace("-", "_")
        if name == "lint" and isinstance(value, dict):
            continue  # [tool.dflashdoctor.lint]: lint's own table (lint/settings.py)
        if name not in known:
            raise BadInput(f"unknown key {key!r} in {source}; known keys: {', '.join(sorted(known))}")
        allowed = _TYPES[str(known[name].type)]
        if not isinstance(value, allowed) or (isinstance(value, bool) and bool not in allowed):
            raise BadInput(f"{key} in {source} must be {known[name].type}, not {type(value).__name__}")
        values[name] = value
    config = GateConfig(**values)
    config.validate()
    return config


_CONFIG_BYTES = 4 * MIB


def _read(path: Path) -> dict[str, Any]:
    """The configuration file: a regular file of at most 4 MiB (a FIFO or /dev/zero given as
    --config is refused at once, not read until the machine runs out of memory)."""
    try:
        return tomllib.loads(read_placed(path, _CONFIG_BYTES, follow=True).decode("utf-8"))
    except PlacedFileError as exc:
        raise BadInput(str(exc)) from None
    except OSError as exc:
        raise BadInput(f"cannot read {path}: {exc.strerror}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:  # TOML is UTF-8: a stray byte is not TOML
        raise BadInput(f"{path} is not valid TOML: {exc}") from None
    except RecursionError:  # arrays nested thousands deep
        raise BadInput(f"{path} is not a configuration: its values nest too deep") from None
    except ValueError as exc:  # an integer past the 4,300 digits Python converts
        raise BadInput(f"{path} is not a configuration: {exc}") from None


@dataclass(frozen=True)
class ConfigSource:
    """Where the configuration came from: the file and its owner (both in the report), or the defaults."""

    path: Path | None
    owner: str | None = None

    def describe(self) -> str:
        return str(self.path) if self.path is not None else "defaults (the embedded reference setup)"


def load_config(explicit: Path | None, cwd: Path, trust: Trust | None = None) -> tuple[GateConfig, ConfigSource]:
    """The configuration and where it came from: --config, ./dflashdoctor.toml, ./pyproject.toml's
    [tool.dflashdoctor], else the defaults (the embedded reference setup). A file whose `run`,
    `target` or `script` another user could have written is refused before it is read (trust.py)."""
    trust = trust or Trust()
    candidates = [explicit] if explicit is not None else [cwd / "dflashdoctor.toml", cwd / "pyproject.toml"]
    for path in candidates:
        if path is None or (explicit is None and not path.is_file()):
            continue
        refused = trust.file_problem(path, "the configuration")
        if refused:
            raise BadInput(refused)
        data = _read(path)
        source = ConfigSource(path, _owner(path))
        if path.name == "pyproject.toml" or "tool" in data:
            tool = data.get("tool", {})
            table = tool.get("dflashdoctor") if isinstance(tool, dict) else None
            if table is not None and not isinstance(table, dict):
                raise BadInput(f"{path}: tool.dflashdoctor must be a table")
            if table is None:
                if explicit is not None:
                    raise BadInput(f"{path} has no [tool.dflashdoctor] table")
                continue
            outside = sorted(key for key in data if key != "tool")
            if outside and path.name != "pyproject.toml":
                raise BadInput(
                    f"{path} has both [tool.dflashdoctor] and top-level keys ({', '.join(outside[:3])}): "
                    "keep the configuration in one of them"
                )
            return _from_table(table, f"{path} [tool.dflashdoctor]"), source
        return _from_table(data, str(path)), source
    return GateConfig(), ConfigSource(None)


def _owner(path: Path) -> str | None:
    try:
        return user_name(os.stat(path).st_uid)
    except OSError:
        return None
