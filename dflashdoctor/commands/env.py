"""`env`: versions, devices, cache roots, the knobs set, and known hazards, for bug reports and the gate."""

from __future__ import annotations

from dataclasses import dataclass

from dflashdoctor.judges.env import judge
from dflashdoctor.observations import EnvObservations
from dflashdoctor.probe_configs import NoConfig
from dflashdoctor.probe_spec import ProbeSpec


@dataclass
class EnvOptions:
    python: str | None = None
    ssh: str | None = None  # [user@]host[:port]: the probed side runs there
    # short: it imports torch and reads versions (in the gate, its `timeout` where one is configured)
    timeout_s: float = 120.0


def probe_config(_options: EnvOptions) -> NoConfig:
    return NoConfig()


SPEC = ProbeSpec(
    name="env",
    summary="Versions, GPUs, cache roots, the TORCH*/TRITON*/FLA*/CUDA*/NCCL* knobs set, and known hazards.",
    options=EnvOptions,
    observations=EnvObservations,
    judge=judge,
    script="env.py",
    probe_config=probe_config,
    forked_in_gate=True,
)
