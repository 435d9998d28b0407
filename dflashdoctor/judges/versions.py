"""Judges the training stack's versions: every requirement one installed package of the stack has
on another must hold. The ones that bite are named for what they break."""

from __future__ import annotations

from dflashdoctor.budgets import Budgets
from dflashdoctor.codes import finding
from dflashdoctor.judges.base import Judge
from dflashdoctor.observations import VersionsObservations
from dflashdoctor.records import PackageRecord, RequirementRecord
from dflashdoctor.report import ProbeResult, Table

# (package, the package it requires) -> what a wrong version of it breaks
_WHAT_BREAKS = {
    (
        "torch",
        "triton",
    ): "torch was built against this triton: Inductor's generated kernels and flex_attention's compiled "
    "templates go through its compiler, so another version fails at the first compile (often hours into a run, "
    "when a new shape compiles) or compiles kernels torch did not test.",
    (
        "transformers",
        "tokenizers",
    ): "transformers checks this version when it is imported and refuses to import with another one.",
    (
        "transformers",
        "huggingface-hub",
    ): "transformers checks this version when it is imported and refuses to import with another one.",
}


class VersionsJudge(Judge):
    def __init__(self, observations: VersionsObservations, budgets: Budgets) -> None:
        super().__init__("versions", budgets)
        self.observations = observations

    def judge(self) -> ProbeResult:
        packages = self.observations.packages
        self.subject = ", ".join(f"{p['name']} {p['version']}" for p in packages) or "none of the stack installed"
        self.measurements["packages"] = {p["name"]: p["version"] for p in packages}
        self.tables.append(
            Table(
                title="installed stack",
                columns=["package", "version", "requires"],
                rows=[[p["name"], p["version"], _requires(p)] for p in packages],
            )
        )
        unreadable = self.observations.unreadable
        for name, why in unreadable.items():
            self._unreadable(name, why)
        if unreadable:
            said = f"cannot be read for {', '.join(unreadable)}"
            self._check("metadata", "warn", said, "package-metadata-unreadable")
        if self.observations.packaging is None:
            self._check("requirements", "skip", "not checked: the probed interpreter has no `packaging` to read them")
            return self.result()
        unmet = [(p, r) for p in packages for r in p["requires"] if r["satisfied"] is False]
        for package, requirement in unmet:
            self._unmet(package, requirement)
        count = sum(len(p["requires"]) for p in packages)
        # packaging could not read these, or what they name has metadata that cannot be read
        unchecked = sum(r["satisfied"] is None for p in packages for r in p["requires"])
        self.measurements["requirements_unmet"] = len(unmet)
        left = f"; {unchecked} could not be checked" if unchecked else ""
        if unmet:
            self._check("requirements", "warn", f"{len(unmet)} of {count} unmet{left}", "requirement-unmet")
        elif unchecked:
            self._check("requirements", "pass", f"{count - unchecked} of {count} requirements hold{left}")
        else:
            self._check("requirements", "pass", f"all {count} requirements of {len(packages)} packages hold")
        return self.result()

    def _unreadable(self, name: str, why: str) -> None:
        """A distribution whose metadata the probe could not read: pip reads the same file, so the
        install is damaged, and whatever requires it was not checked against it."""
        self.findings.append(
            finding(
                "package-metadata-unreadable",
                f"{name}'s installed metadata cannot be read: {why}",
                detail=f"Its version and requirements are unknown, and the requirements other packages have on "
                f"{name} are listed unchecked. pip and importlib.metadata read the same file.",
                evidence={"package": name, "error": why},
                fix=f"pip install --force-reinstall --no-deps {name}",
            )
        )

    def _unmet(self, package: PackageRecord, requirement: RequirementRecord) -> None:
        wanted = requirement["requirement"].split(";")[0].strip()
        has = f"{requirement['installed']} is installed" if requirement["installed"] else "it is not installed"
        breaks = _WHAT_BREAKS.get((package["name"], requirement["name"]), "")
        self.findings.append(
            finding(
                "requirement-unmet",
                f"{package['name']} {package['version']} requires {wanted}, but {has}",
                detail=(breaks + " " if breaks else "")
                + f"The requirement as {package['name']}'s metadata writes it: {requirement['requirement']}.",
                evidence={"package": package["name"], "version": package["version"], **requirement},
                fix=f"pip install '{wanted}' (or install the {package['name']} release made for "
                f"{requirement['name']} {requirement['installed'] or 'you need'})",
            )
        )


def _requires(package: PackageRecord) -> str:
    """Its requirements on one line: the unmet ones marked."""
    words = [
        r["requirement"].split(";")[0].strip() + (" (unmet)" if r["satisfied"] is False else "")
        for r in package["requires"]
    ]
    return ", ".join(words) or "-"


def judge(observations: VersionsObservations, budgets: Budgets) -> list[ProbeResult]:
    return [VersionsJudge(observations, budgets).judge()]
