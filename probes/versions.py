"""Probe: the training stack's installed distributions and their requirements on each other, from
package metadata alone (nothing of the stack is imported: a broken pairing is exactly what makes an
import fail). A requirement's marker and version range are read with `packaging` where the probed
interpreter has it (pip, transformers and most environments do); without it they are listed
unchecked. The doctor judges; nothing here decides.
"""

from __future__ import annotations

import sys
from importlib import metadata
from typing import Any

from dflashdoctor.observations import VersionsObservations, dump
from dflashdoctor.probe_support import probe_main

# The distributions a compiled-attention training run rests on, and those they pin.
STACK = ("torch", "triton", "transformers", "fla-core", "flash-linear-attention", "tokenizers", "kernels", "einops")


def _installed(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _requirements(name: str, check: Any) -> list[dict[str, Any]]:
    """Each requirement of `name` that applies here (no extra), with the version installed."""
    found = []
    for text in metadata.requires(name) or []:
        parsed = check(text) if check else None
        if parsed is not None and not parsed["applies"]:
            continue
        required = parsed["name"] if parsed else text.split(";")[0].strip()
        found.append(
            {
                "requirement": text,
                "name": required,
                "installed": _installed(required) if parsed else None,
                "satisfied": parsed["satisfied"](_installed(required)) if parsed else None,
            }
        )
    return found


def _checker() -> tuple[Any, str | None]:
    """A function reading one requirement with `packaging`, and its version; (None, None) without it."""
    try:
        import packaging
        from packaging.requirements import InvalidRequirement, Requirement
    except ImportError:
        return None, None

    def check(text: str) -> dict[str, Any] | None:
        try:
            requirement = Requirement(text)
        except InvalidRequirement:
            return None
        applies = requirement.marker is None or requirement.marker.evaluate({"extra": ""})
        return {
            "name": requirement.name,
            "applies": applies,
            "satisfied": lambda version: (
                version is not None and requirement.specifier.contains(version, prereleases=True)
            ),
        }

    return check, getattr(packaging, "__version__", "unknown")


def run(_config: dict[str, Any]) -> dict[str, Any]:
    check, packaging_version = _checker()
    packages = [
        {"name": name, "version": version, "requires": _requirements(name, check)}
        for name in STACK
        if (version := _installed(name)) is not None
    ]
    return dump(VersionsObservations(python=sys.version.split()[0], packaging=packaging_version, packages=packages))


if __name__ == "__main__":
    probe_main(run)
