"""The cgroup v2 a run's command is in, when that cgroup is the run's own: a process cannot leave it
(moving one takes write access to the cgroup tree, which root or a delegated manager has), so every
member there that this doctor did not start beside the command is the command's descendant, even
one whose parent, the launcher, was killed and whose orphans went to init.

The doctor makes no cgroup of its own: the command would then read the limits of that cgroup
(memory.max, cpu.max, which runtimes size themselves by) instead of those it was given. It uses the
one it was started in, where that holds nothing but this doctor and what it started (a Slurm task, a
systemd service, a container): `private_to` says so as the command starts. Linux only; elsewhere,
and on cgroup v1 alone, there is none.
"""

from __future__ import annotations

from pathlib import Path

from dflashdoctor.processes import Entry, descendants


def _escaped(field: str) -> str:
    """A mount point as /proc/self/mountinfo writes it: space, tab, newline, backslash as octal."""
    for code in ("040", "011", "012", "134"):
        field = field.replace(f"\\{code}", chr(int(code, 8)))
    return field


def folder_of(pid: int) -> Path | None:
    """The cgroup v2 folder of `pid`, where the unified hierarchy is mounted here; None elsewhere."""
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
        mounts = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return None
    path = next((line[3:] for line in lines if line.startswith("0::/")), None)
    for mount in mounts:
        fields = mount.split(" ")
        if path is None or "-" not in fields:
            continue
        kind = fields[fields.index("-") + 1 :]
        root, point = _escaped(fields[3]), _escaped(fields[4])
        if kind and kind[0] == "cgroup2" and (path == root or path.startswith(root.rstrip("/") + "/")):
            return Path(point) / path[len(root) :].lstrip("/")
    return None


def members(folder: Path) -> set[int]:
    """The processes in the cgroup at `folder` now (none where it cannot be read, or is gone)."""
    try:
        return {int(word) for word in (folder / "cgroup.procs").read_text().split()}
    except (OSError, ValueError):
        return set()


def private_to(doctor: int, table: dict[int, Entry]) -> Path | None:
    """The cgroup of `doctor` when it holds nothing but the doctor and what the doctor started."""
    folder = folder_of(doctor)
    if folder is None:
        return None
    found = members(folder)
    return folder if doctor in found and found <= {doctor} | descendants(doctor, table) else None
