"""Probe: the environment as the probed interpreter sees it.

Versions (read from package metadata where importing would be costly or could fail: transformers
is never imported, and triton and FLA only as far as `fla.utils`, where FLA is installed, to read its
platform and its own guards), the GPUs torch sees, the knobs set in the environment,
dynamo's recompile limit, the cache roots with their sizes and filesystems (on this machine:
with `--ssh` the probed side is another one), and whether the big packages' bytecode is compiled
or can be written (and how long importing torch then took). Secret values are redacted
here, as they are read; the doctor judges, nothing here decides.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

from dflashdoctor.bytecode import interpreter_bytecode, package_bytecode
from dflashdoctor.cache.environment import NETWORK_FILESYSTEMS, mount_of, untrusted_root
from dflashdoctor.cache.roots import resolve_roots
from dflashdoctor.fla_guards import fla_state
from dflashdoctor.observations import EnvObservations, dump
from dflashdoctor.probe_configs import NoConfig
from dflashdoctor.probe_support import probe_main
from dflashdoctor.records import CacheRootRecord
from dflashdoctor.redaction import redact_variables

VARIABLE_PREFIXES = ("TORCH", "TRITON", "FLA_", "CUDA", "NCCL", "PYTORCH", "HF_", "TRANSFORMERS", "NVIDIA", "OMP_")
_PACKAGES = ("torch", "triton", "transformers", "fla-core", "flash-linear-attention", "numpy", "dflashdoctor")
# import names of the packages every process of a compiled-attention run imports
_BYTECODE_PACKAGES = ("torch", "triton", "transformers", "fla")


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def _smi(query: str) -> list[list[str]]:
    """nvidia-smi's CSV rows for `query`; none where it is missing or fails."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    try:
        done = subprocess.run(
            [smi, f"--query-gpu={query}", "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=20
        )
    except (OSError, subprocess.SubprocessError):
        return []
    if done.returncode != 0:
        return []
    return [[cell.strip() for cell in line.split(",")] for line in done.stdout.strip().splitlines() if line.strip()]


_SMI_FIELDS = "index,name,compute_cap,memory.total,driver_version"
Gpus = list[dict[str, Any]]


def _smi_gpus() -> tuple[Gpus | None, str | None]:
    """The GPUs as the driver lists them (in PCI bus order), without a CUDA context: initialising
    CUDA here took seconds of every gate on an H200, beside the probes that need it; and the
    driver's version. One nvidia-smi call; a second only for a driver too old for compute_cap.
    GPUs None: ask torch instead."""
    rows = _smi(_SMI_FIELDS)
    try:
        gpus = [
            {"index": int(index), "name": name, "capability": cap, "memory_bytes": int(float(mib) * 2**20)}
            for index, name, cap, mib, _driver in rows
        ]
    except ValueError:  # another layout
        gpus = []
    if rows and gpus:
        return gpus, rows[0][-1]
    driver_only = _smi("driver_version")
    return None, (driver_only[0][0] if driver_only and driver_only[0] else None)


def gpus_in_cuda_order(listed: Gpus | None, count: int, environ: dict[str, str]) -> Gpus | None:
    """nvidia-smi's list where it names the GPUs by their CUDA index, else None. nvidia-smi counts
    in PCI bus order, CUDA fastest first unless CUDA_DEVICE_ORDER=PCI_BUS_ID: on a machine whose GPUs
    differ, the two orders can disagree, so the list is taken only where the orders agree or every
    GPU is alike; CUDA_VISIBLE_DEVICES renumbers them, so not with it."""
    if listed is None or len(listed) != count or environ.get("CUDA_VISIBLE_DEVICES") is not None:
        return None
    alike = len({(g["name"], g["capability"], g["memory_bytes"]) for g in listed}) == 1
    return listed if alike or environ.get("CUDA_DEVICE_ORDER") == "PCI_BUS_ID" else None


def _torch(listed: Gpus | None) -> dict[str, Any]:
    started = time.perf_counter()
    import torch

    import_s = time.perf_counter() - started

    gpus = []
    available = torch.cuda.is_available()
    in_order = gpus_in_cuda_order(listed, torch.cuda.device_count(), dict(os.environ)) if available else None
    if in_order is not None:
        gpus = in_order
    elif available:
        for index in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(index)
            gpus.append(
                {
                    "index": index,
                    "name": props.name,
                    "capability": f"{props.major}.{props.minor}",
                    "memory_bytes": props.total_memory,
                }
            )
    try:
        import torch._dynamo.config as dynamo_config

        recompile_limit = getattr(dynamo_config, "recompile_limit", None)
        dynamo_disabled = bool(getattr(dynamo_config, "disable", False))
    except Exception:  # an odd build without dynamo
        recompile_limit, dynamo_disabled = None, None
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    return {
        "torch": torch.__version__,
        "import_torch_s": round(import_s, 3),
        "cuda": torch.version.cuda,
        "cudnn": cudnn,
        "cuda_available": torch.cuda.is_available(),
        "gpus": gpus,
        "recompile_limit": recompile_limit,
        "dynamo_disabled": dynamo_disabled,
    }


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


def _cache_roots() -> list[CacheRootRecord]:
    rows = []
    for root in resolve_roots(os.environ, None, None, all_roots=False):
        exists = root.path.is_dir()
        files, size = _size(root.path) if exists else (0, 0)
        row = CacheRootRecord(
            kind=root.kind,
            path=str(root.path),
            source=root.source,
            exists=exists,
            files=files,
            bytes=size,
            untrusted=untrusted_root(root.path),
        )
        mount = mount_of(root.path)  # of the folder that will hold it, where it does not exist yet
        if mount:
            row["mount_point"], row["filesystem"] = mount
            row["network_filesystem"] = mount[1] in NETWORK_FILESYSTEMS
        rows.append(row)
    return rows


def run(_config: NoConfig) -> dict[str, Any]:  # env takes no options
    listed, driver = _smi_gpus()
    return dump(
        EnvObservations(
            **{
                "python": sys.version.split()[0],
                "executable": sys.executable,
                "platform": platform.platform(),
                "packages": {name: _version(name) for name in _PACKAGES},
                "driver": driver,
                # redacted here, where they are read: no observations.json or report keeps a secret
                "variables": redact_variables(
                    {k: v for k, v in sorted(os.environ.items()) if k.startswith(VARIABLE_PREFIXES)}
                ),
                "cache_roots": _cache_roots(),
                # before torch is imported: nothing written by this probe's own imports is counted
                "bytecode": interpreter_bytecode()
                | {"packages": [p for p in map(package_bytecode, _BYTECODE_PACKAGES) if p]},
                **_torch(listed),
                "fla": fla_state(),  # after torch: fla.utils imports it and triton
            }
        )
    )


if __name__ == "__main__":
    probe_main(run, NoConfig)
