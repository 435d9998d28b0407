"""Probe: `cache check` on the probed machine, for `cache check --ssh` and the gate on another node.

The scan is the doctor's own (dflashdoctor/cache/scan.py), run where the roots are; the doctor
judges. Standard library only: a node whose Python lacks torch still has its caches checked.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from dflashdoctor.cache.observations import CacheObservations
from dflashdoctor.cache.roots import described
from dflashdoctor.cache.scan import installed_triton, scan_roots
from dflashdoctor.observations import dump
from dflashdoctor.probe_configs import CacheCheckConfig
from dflashdoctor.probe_support import probe_main


def run(config: CacheCheckConfig) -> dict[str, Any]:
    triton_dir, inductor_dir = (Path(path) if path else None for path in (config.triton_dir, config.inductor_dir))
    roots, scans, facts = scan_roots(os.environ, triton_dir, inductor_dir, config.all_roots)
    return dump(CacheObservations(scans=scans, facts=facts, roots=described(roots), triton=installed_triton()))


if __name__ == "__main__":
    probe_main(run, CacheCheckConfig)
