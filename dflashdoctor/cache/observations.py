"""What `cache check`, `fix` and `restore` observed: the doctor side's own observations (nothing
is probed), kept here so that observations.py, which the probed side imports, holds none of the
cache's types."""

from __future__ import annotations

from dataclasses import dataclass, field

from dflashdoctor.cache.model import RootScan
from dflashdoctor.cache.repair_log import RepairLog
from dflashdoctor.records import RootFacts


@dataclass
class CacheObservations:
    """What `cache check`, `fix` or `restore` saw and did: on the doctor's own machine, or (check
    only) on another one, written there by probes/cache_check.py."""

    scans: list[RootScan] = field(default_factory=list)
    facts: dict[str, RootFacts] = field(default_factory=dict)  # root path -> where it lives (roots that exist)
    log: RepairLog = field(default_factory=RepairLog)
    roots: str = ""  # the roots scanned, as "kind path, ...": the report's target
    triton: str | None = None  # the triton installed where the roots were scanned
