"""`env`: versions, devices, cache roots, the knobs set, and known hazards, for bug reports and the gate."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dflashdoctor.cache.roots import resolve_roots
from dflashdoctor.judges.env import EnvJudge
from dflashdoctor.report import Report
from dflashdoctor.session import finish, new_report, probe_into_report, probe_python


@dataclass
class EnvOptions:
    python: str | None = None
    timeout_s: float = 120.0


def _size(root: Path) -> tuple[int, int]:
    """Files and bytes under a cache root (links not followed)."""
    files = size = 0
    for folder, _dirs, names in os.walk(root):
        for name in names:
            try:
                size += os.lstat(os.path.join(folder, name)).st_size
                files += 1
            except OSError:
                continue
    return files, size


def cache_roots() -> list[dict[str, Any]]:
    rows = []
    for root in resolve_roots(os.environ, None, None, all_roots=False):
        exists = root.path.is_dir()
        files, size = _size(root.path) if exists else (0, 0)
        where = {"kind": root.kind, "path": str(root.path), "source": root.source}
        rows.append(where | {"exists": exists, "files": files, "bytes": size})
    return rows


def env(options: EnvOptions, argv: list[str]) -> Report:
    started = time.monotonic()
    report = new_report("env", argv)
    python = probe_python(options.python)
    roots = cache_roots()
    probe_into_report(
        report, "env", {}, python=python, timeout_s=options.timeout_s, judge=lambda obs: EnvJudge(obs, roots).judge()
    )
    return finish(report, started)
