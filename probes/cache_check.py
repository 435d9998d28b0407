"""Probe: `cache check` on the probed machine, for `cache check --ssh` and the gate on another node.

The scan is the doctor's own (dflashdoctor/cache/scan.py), run where the roots are; the doctor
judges. Standard library only: a node whose Python lacks torch still has its caches checked.
"""

from __future__ import annotations

import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

from dflashdoctor.cache.scan import installed_triton, scan_roots
from dflashdoctor.probe_support import probe_main


def run(config: dict[str, Any]) -> dict[str, Any]:
    paths = {key: Path(config[key]) if config.get(key) else None for key in ("triton_dir", "inductor_dir")}
    roots, scans, facts = scan_roots(os.environ, paths["triton_dir"], paths["inductor_dir"], config["all_roots"])
    return {
        "scans": [asdict(scan) for scan in scans],
        "facts": facts,
        "roots": ", ".join(f"{r.kind} {r.path}" for r in roots),
        "triton": installed_triton(),
    }


if __name__ == "__main__":
    probe_main(run)
