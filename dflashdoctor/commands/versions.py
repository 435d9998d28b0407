"""`versions`: the training stack's installed versions, and whether each one's own requirements on
the others hold (a triton that is not the one torch was built against, a tokenizers transformers
refuses to import with)."""

from __future__ import annotations

from dataclasses import dataclass

from dflashdoctor.judges.versions import judge
from dflashdoctor.observations import VersionsObservations
from dflashdoctor.probe_configs import NoConfig
from dflashdoctor.probe_spec import ProbeSpec


@dataclass
class VersionsOptions:
    python: str | None = None
    ssh: str | None = None  # [user@]host[:port]: the probed side runs there
    timeout_s: float = 60.0  # it reads package metadata and imports nothing of the stack


def probe_config(_options: VersionsOptions) -> NoConfig:
    return NoConfig()


SPEC = ProbeSpec(
    name="versions",
    summary="Are the installed torch, triton, transformers and FLA the versions each other requires?",
    options=VersionsOptions,
    observations=VersionsObservations,
    judge=judge,
    script="versions.py",
    probe_config=probe_config,
)
