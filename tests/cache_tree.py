"""Triton cache folders laid out as triton writes them (runtime/cache.py, compiler/compiler.py), with
contents of our own making, and the damage a crash or a bad copy leaves. Used by the cache tests and
by benchmarks/cache_scan.py.

A kernel entry: key folder = base32(sha256) without padding; `<name>.ttir/.ttgir/.llir/.ptx`
(text), `<name>.cubin` (ELF), `<name>.json` (metadata with `hash` and `triton_version`), and
`__grp__<name>.json` listing every child by absolute path, written last.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import random
import struct
from importlib import metadata
from pathlib import Path

TEXT_PARTS = ("ttir", "ttgir", "llir", "ptx")


def _installed_triton() -> str:
    try:
        return metadata.version("triton")
    except metadata.PackageNotFoundError:
        return "3.6.0"


INSTALLED = _installed_triton()  # entries are written as this triton would write them: not stale


def elf_bytes(payload: int = 2048) -> bytes:
    """A minimal little-endian ELF64 whose section header table sits at the end, as in a cubin."""
    shnum, shentsize = 4, 64
    shoff = 64 + payload
    header = bytearray(64)
    header[:4] = b"\x7fELF"
    header[4], header[5], header[6] = 2, 1, 1
    struct.pack_into("<HHIQQQIHHHHHH", header, 16, 2, 190, 1, 0, 0, shoff, 0, 64, 0, 0, shentsize, shnum, 0)
    return (
        bytes(header) + bytes(random.Random(payload).getrandbits(8) for _ in range(payload)) + bytes(shnum * shentsize)
    )


ELF = elf_bytes()  # a whole, valid ELF image, for binaries of any name


def key_for(seed: str) -> tuple[str, str]:
    """(sha256 hex, key folder name) for a seed."""
    digest = hashlib.sha256(seed.encode()).hexdigest()
    return digest, base64.b32encode(bytes.fromhex(digest)).decode().rstrip("=")


def inductor_key(seed: str) -> str:
    """A key as Inductor makes one for generated code (torch/_inductor/cache_key.py, CODE strategy):
    `c` and the first 51 characters of the sha256's base32, lowercase."""
    return "c" + base64.b32encode(hashlib.sha256(seed.encode()).digest()).decode()[:51].lower()


def generated_path(root: Path, seed: str, extension: str) -> Path:
    """Where Inductor writes a generated file (codecache.get_path): `<root>/<key[1:3]>/<key>.<ext>`;
    its shard folder made."""
    key = inductor_key(seed)
    (root / key[1:3]).mkdir(parents=True, exist_ok=True)
    return root / key[1:3] / f"{key}.{extension}"


def write_kernel(root: Path, seed: str, name: str = "add_kernel", version: str = INSTALLED) -> Path:
    digest, key = key_for(seed)
    folder = root / key
    folder.mkdir(parents=True)
    children = {}
    for part in TEXT_PARTS:
        path = folder / f"{name}.{part}"
        path.write_text(f"// {part} of {name} ({seed})\nmodule {{\n  tt.func @{name}() {{ tt.return }}\n}}\n")
        children[path.name] = str(path)
    binary = folder / f"{name}.cubin"
    binary.write_bytes(ELF)
    children[binary.name] = str(binary)
    metadata = folder / f"{name}.json"
    metadata.write_text(json.dumps({"hash": digest, "name": name, "num_warps": 4, "triton_version": version}))
    children[metadata.name] = str(metadata)
    (folder / f"__grp__{name}.json").write_text(json.dumps({"child_paths": children}))
    return folder


def write_autotune(root: Path, seed: str, fn: str = "add_kernel") -> Path:
    _, key = key_for("autotune-" + seed)
    folder = root / key
    folder.mkdir(parents=True)
    timings = [[{"kwargs": {"BLOCK": 64}, "num_warps": 4}, [0.01, 0.01, 0.01]]]
    (folder / f"{fn}.autotune.json").write_text(json.dumps({"key": [512, "torch.float32"], "configs_timings": timings}))
    return folder


def write_extension_module(root: Path, module: str) -> Path:
    """A Python extension module that a triton driver compiled (its launcher, `cuda_utils`): one file,
    no group file, as triton's `compile_module_from_src` leaves it."""
    _, key = key_for("module-" + module)
    folder = root / key
    folder.mkdir(parents=True)
    (folder / f"{module}.cpython-311-x86_64-linux-gnu.so").write_bytes(ELF)
    return folder


def healthy_tree(root: Path, kernels: int) -> list[Path]:
    """`kernels` kernel entries (returned), plus an autotune-only folder and two driver-module folders,
    which have no group file by design."""
    root.mkdir(parents=True, exist_ok=True)
    write_autotune(root, "a")
    write_extension_module(root, "__triton_launcher")
    write_extension_module(root, "cuda_utils")
    return [write_kernel(root, f"kernel-{i}", name=f"kernel_{i % 7}") for i in range(kernels)]


# Damage a crash or a bad copy leaves; each returns the path a scan must name as the broken entry.
def truncate_binary(folder: Path) -> Path:
    binary = next(folder.glob("*.cubin"))
    binary.write_bytes(binary.read_bytes()[: binary.stat().st_size // 2])
    return folder


def damage_header(folder: Path) -> Path:
    binary = next(folder.glob("*.cubin"))
    data = bytearray(binary.read_bytes())
    data[:4] = b"\x00\x00\x00\x00"  # zero-filled blocks after a power loss
    binary.write_bytes(bytes(data))
    return folder


def truncate_json(folder: Path) -> Path:
    metadata = next(p for p in folder.glob("*.json") if not p.name.startswith("__grp__"))
    metadata.write_text(metadata.read_text()[:10])
    return folder


def break_group(folder: Path) -> Path:
    group = next(folder.glob("__grp__*.json"))
    group.write_text(group.read_text().replace("}", "", 1) + ",")
    return folder


def delete_child(folder: Path) -> Path:
    next(folder.glob("*.ttgir")).unlink()
    return folder


def empty_file(folder: Path) -> Path:
    next(folder.glob("*.llir")).write_bytes(b"")
    return folder


def group_outside(folder: Path) -> Path:
    group = next(folder.glob("__grp__*.json"))
    data = json.loads(group.read_text())
    data["child_paths"] = {
        k: v.replace(str(folder.parent), "/home/someone/.triton/cache") for k, v in data["child_paths"].items()
    }
    group.write_text(json.dumps(data))
    return folder


def stray_tmp(folder: Path) -> Path:
    tmp = folder / "tmp.pid_999999999_0f3c7a1e-0000-4000-8000-000000000000"
    tmp.mkdir()
    (tmp / "kernel.cubin").write_bytes(ELF[:100])
    return tmp


def no_group(folder: Path) -> Path:
    next(folder.glob("__grp__*.json")).unlink()
    return folder


DAMAGE = {
    "truncate-binary": truncate_binary,
    "damage-header": damage_header,
    "truncate-json": truncate_json,
    "break-group": break_group,
    "delete-child": delete_child,
    "empty-file": empty_file,
    "group-outside": group_outside,
    "stray-tmp": stray_tmp,
    "no-group": no_group,
}


def snapshot(root: Path) -> dict[str, tuple[int, str, int]]:
    """Every file under `root`: relative path -> (size, sha256, mode), to compare trees byte for byte."""
    out = {}
    for parent, _dirs, files in os.walk(root):
        for name in files:
            path = Path(parent, name)
            data = path.read_bytes()
            out[str(path.relative_to(root))] = (len(data), hashlib.sha256(data).hexdigest(), path.stat().st_mode)
    return out
