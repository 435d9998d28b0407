"""Probe: the training stack's installed distributions and their requirements on each other, from
package metadata alone (nothing of the stack is imported: a broken pairing is exactly what makes an
import fail). A requirement's marker and version range are read with `packaging` where the probed
interpreter has it (pip, transformers and most environments do); without it they are listed
unchecked. The doctor judges; nothing here decides.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from importlib import metadata
from typing import Any

from dflashdoctor.observations import VersionsObservations, dump
from dflashdoctor.probe_configs import NoConfig
from dflashdoctor.probe_support import first_line, probe_main
from dflashdoctor.records import PackageRecord, RequirementRecord

# The distributions a compiled-attention training run rests on, and those they pin.
STACK = ("torch", "triton", "transformers", "fla-core", "flash-linear-attention", "tokenizers", "kernels", "einops")
# Reading a distribution's metadata: bytes that are not UTF-8, or an OSError importlib.metadata does not
# take as "not there" (it swallows a missing file, a folder, no permission; not a loop of links or EIO).
_UNREADABLE = (UnicodeDecodeError, OSError)


class _Installed:
    """What is installed, read from each distribution's metadata once (a requirement named by several
    packages, or a hundred times by one, is not looked up on sys.path again each time), and the
    distributions whose metadata cannot be read at all, each with why: bytes that are not UTF-8, or
    an error reading the file that importlib.metadata does not take as "not there". Such a package
    is not crashed on: it is named (the doctor's finding), and what requires it is left unchecked."""

    def __init__(self) -> None:
        self.versions: dict[str, str | None] = {}
        self.unreadable: dict[str, str] = {}

    def version(self, name: str) -> str | None:
        if name not in self.versions:
            self.versions[name] = self._read(name, metadata.version)
        return self.versions[name]

    def requires(self, name: str) -> list[str] | None:
        """Its requirements; None when they cannot be read (an egg's requires.txt is a file of its own)."""
        return self._read(name, lambda n: metadata.requires(n) or [])

    def _read(self, name: str, read: Callable[[str], Any]) -> Any:
        try:
            return read(name)
        except metadata.PackageNotFoundError:
            return None
        except _UNREADABLE as exc:
            self.unreadable.setdefault(name, first_line(f"{type(exc).__name__}: {exc}"))
            return None


def _requirements(name: str, check: Any, installed: _Installed) -> list[RequirementRecord]:
    """Each requirement of `name` that applies here (no extra), with the version installed. One that
    names a package whose metadata cannot be read is listed unchecked, as is one `check` cannot read."""
    found = []
    for text in installed.requires(name) or []:
        parsed = check(text) if check else None
        if parsed is not None and not parsed["applies"]:
            continue
        required = parsed["name"] if parsed else text.split(";")[0].strip()
        version = installed.version(required) if parsed else None
        known = parsed is not None and required not in installed.unreadable
        satisfied = parsed["satisfied"](version) if parsed is not None and known else None
        found.append(RequirementRecord(requirement=text, name=required, installed=version, satisfied=satisfied))
    return found


def _checker() -> tuple[Any, str | None]:
    """A function reading one requirement with `packaging`, and its version; (None, None) without it."""
    try:
        import packaging
        from packaging.requirements import Requirement
    except ImportError:
        return None, None

    def check(text: str) -> dict[str, Any] | None:
        """None for a requirement packaging cannot read or evaluate: InvalidRequirement, or a version
        in it, in its marker or installed that packaging cannot compare (an InvalidVersion, or more
        than the 4,300 digits Python turns into an int): a ValueError, left unchecked."""
        try:
            requirement = Requirement(text)
            applies = requirement.marker is None or requirement.marker.evaluate({"extra": ""})
        except ValueError:  # InvalidRequirement is one
            return None

        def satisfied(version: str | None) -> bool | None:
            try:
                return version is not None and requirement.specifier.contains(version, prereleases=True)
            except ValueError:
                return None

        return {"name": requirement.name, "applies": applies, "satisfied": satisfied}

    return check, getattr(packaging, "__version__", "unknown")


def run(_config: NoConfig) -> dict[str, Any]:
    check, packaging_version = _checker()
    installed = _Installed()
    packages = [
        PackageRecord(name=name, version=version, requires=_requirements(name, check, installed))
        for name in STACK
        if (version := installed.version(name)) is not None
    ]
    return dump(
        VersionsObservations(
            python=sys.version.split()[0],
            packaging=packaging_version,
            packages=packages,
            unreadable=installed.unreadable,
        )
    )


if __name__ == "__main__":
    probe_main(run, NoConfig)
