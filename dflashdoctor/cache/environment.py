"""Where a cache root lives: the filesystem under it, its free space, whether we may write it, and
whether several ranks of one job are set up to share it."""

from __future__ import annotations

import os
import shutil
import stat
from collections.abc import Mapping
from pathlib import Path

from dflashdoctor.records import RootFacts
from dflashdoctor.safe_fs import user_name

# Filesystems where triton's rename-based writes are not safe across clients, or slow (EBUSY and
# FileNotFoundError have been seen on NFS).
NETWORK_FILESYSTEMS = {
    "nfs", "nfs4", "cifs", "smb3", "smbfs", "lustre", "gpfs", "beegfs", "ceph", "glusterfs", "9p",
    "afs", "fuse.sshfs", "fuse.gcsfuse", "fuse.s3fs", "fuse.juicefs", "fuse.glusterfs", "fuse.ceph", "wekafs",
}  # fmt: skip
LOW_FREE_BYTES = 2 * 2**30
_RANK_VARIABLES = ("WORLD_SIZE", "LOCAL_WORLD_SIZE")


def _unescape(field: str) -> str:
    """Mount table fields escape space, tab, newline and backslash as octal."""
    return field.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n").replace("\\134", "\\")


def mount_of(path: Path, mounts_file: Path = Path("/proc/mounts")) -> tuple[str, str] | None:
    """(mount point, filesystem type) of the mount holding `path`: the longest matching mount point."""
    try:
        lines = mounts_file.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return None
    try:
        target = str(path.resolve())
    except (OSError, RuntimeError):  # a symlink loop (RuntimeError on Python 3.11)
        target = os.path.abspath(path)
    best: tuple[str, str] | None = None
    for line in lines:
        fields = line.split()
        if len(fields) < 3:
            continue
        point, fstype = _unescape(fields[1]), fields[2]
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and (best is None or len(point) > len(best[0])):
            best = (point, fstype)
    return best


def untrusted_root(path: Path) -> str | None:
    """Why the code in a cache root may be another user's: torch.compile loads the generated Python
    and shared objects it finds there, so a root another user owns, or can write into (the default
    Inductor root sits in the world-writable temp folder, where anyone can make it first), is a way
    into the next compiled process of whoever uses it. None for a root of this user's or root's."""
    try:
        info = os.lstat(path)
    except OSError:
        return None  # not made yet: whoever runs torch.compile first makes it their own
    if stat.S_ISLNK(info.st_mode):
        info = os.stat(path) if os.path.exists(path) else info
    if info.st_uid not in (os.geteuid(), 0):
        return f"owned by {user_name(info.st_uid)}, not by {user_name(os.geteuid())}, who runs this"
    if info.st_mode & 0o022 and not info.st_mode & stat.S_ISVTX:
        return f"writable by others (mode {stat.S_IMODE(info.st_mode):o})"
    return None


def inspect_root(path: Path, env: Mapping[str, str], *, relative: bool, empty: bool, source: str) -> RootFacts:
    """Facts about a root's place, with how it was named; the judge turns them into findings."""
    untrusted = untrusted_root(path)
    mount = mount_of(path)
    usage = shutil.disk_usage(path)
    sizes = {name: env[name] for name in _RANK_VARIABLES if env.get(name, "").isdigit() and int(env[name]) > 1}
    rank_specific = any(env.get(v, "") and env[v] in path.parts for v in ("RANK", "LOCAL_RANK"))
    facts: RootFacts = {
        "untrusted": untrusted,
        "free_bytes": usage.free,
        "low_space": usage.free < LOW_FREE_BYTES,
        "writable": os.access(path, os.W_OK | os.X_OK),
        "shared_by_ranks": sizes if sizes and not rank_specific else {},
        "relative": relative,
        "empty": empty,
        "source": source,
    }
    if mount:
        facts["mount_point"], facts["filesystem"] = mount
        facts["network_filesystem"] = mount[1] in NETWORK_FILESYSTEMS
    return facts
