"""What each probe script is started with, typed: one frozen dataclass per probe's config.

Both sides import it. A command's `probe_config` hook builds its probe's config from its Options
(every default lives there, so these classes have none), the runner writes it as JSON (`to_json`,
to a file here or in the tar `--ssh` sends), and `probe_support.probe_main` loads it back with
`load_config`: strictly, as the doctor loads observations, since both ends are this version. A key
unknown or missing, or a value of another type, is a ConfigError naming where: a renamed field
fails the probe's tests instead of being read as a default or a KeyError deep in a probe.
Standard library only, and the probed side's own modules.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, TypeVar

from dflashdoctor.budgets import Budgets
from dflashdoctor.observations import ObservationsError, dump, load
from dflashdoctor.shapes import FIELD_TYPES, OPTION_FIELDS

C = TypeVar("C")


class ConfigError(ValueError):
    """A config that is not the one its probe reads: the doctor's bug, never the user's input."""


@dataclass(frozen=True)
class NoConfig:
    """env and versions: nothing to set."""


@dataclass(frozen=True)
class CheckCompileConfig:
    target: str  # package.module:attr or path/to/file.py:attr
    device: str  # auto, cpu or cuda: the probe resolves auto
    # shapes.AttentionShape's fields the user set; the others take the device's default there
    shape: dict[str, int | str]
    mask: str
    vary: int

    def __post_init__(self) -> None:
        # the shape's keys and their types are AttentionShape's: checked here, not restated as a class
        settable = {f.name for f in OPTION_FIELDS}
        for key, value in self.shape.items():
            if key not in settable:
                raise ConfigError(f"probe config CheckCompileConfig.shape: unknown key {key!r}")
            kind = FIELD_TYPES[key]
            if type(value) is not kind:
                raise ConfigError(
                    f"probe config CheckCompileConfig.shape[{key!r}]: expected {kind.__name__}, "
                    f"got {type(value).__name__}"
                )


@dataclass(frozen=True)
class TraceAttentionConfig:
    model: str | None  # a preset, a config.json or a model folder; None: no model part
    scale: str  # tiny, full or auto
    device: str
    backward: bool | None  # None: per part
    steps: int
    seq_len: int
    script: str | None
    script_args: list[str]
    expect_wrapper: str | None
    drafter: bool
    drafter_fault: str | None


@dataclass(frozen=True)
class RaceConfig:
    threads: int
    kernel: str  # stub, fla, reference or a TARGET
    trials: int
    fix: str
    seed: int
    processes: int  # 0: no process trial
    trials_budget_s: float  # what the real kernels' trials may take together
    binaries_dir: str | None  # absolute


@dataclass(frozen=True)
class KernelTrialConfig:
    """The race probe's trial host (autotune/kernel_trial.py), started by autotune/kernel_runs.py."""

    target: str
    threads: int
    fix: str
    devices: list[str]
    trials: int


@dataclass(frozen=True)
class CacheCheckConfig:
    """`cache check --ssh`, and the gate's cache section on another node."""

    triton_dir: str | None  # None: the roots Triton would use there
    inductor_dir: str | None
    all_roots: bool


@dataclass(frozen=True)
class RunSmokeConfig:
    """The gate's `run` section on another node (probes/run_smoke.py)."""

    command: list[str]
    steps: int
    timeout_s: float
    budgets: Budgets  # the gate's: the node judges with them
    cwd: str  # the folder the gate was started in, shared by the nodes
    argv: list[str]  # the gate's command line, for the node's report


ProbeConfig = NoConfig | CheckCompileConfig | TraceAttentionConfig | RaceConfig | CacheCheckConfig | RunSmokeConfig


def to_json(config: ProbeConfig | KernelTrialConfig) -> str:
    """The JSON `load_config` reads back."""
    return json.dumps(dump(config))


def load_config(cls: type[C], data: Any) -> C:
    """`cls` from its JSON form; a ConfigError naming where it differs."""
    try:
        return load(cls, data, strict=True)
    except ObservationsError as exc:
        raise ConfigError(f"probe config {exc}") from None
