"""Judges cache scans: one finding per broken entry, the root's surroundings, and what fix/restore did."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dflashdoctor.budgets import Budgets
from dflashdoctor.cache.model import Problem, RootScan
from dflashdoctor.cache.observations import CacheObservations
from dflashdoctor.cache.repair_log import QuarantineRun, Refusal
from dflashdoctor.codes import finding
from dflashdoctor.judges.base import Judge, size_text
from dflashdoctor.report import CheckStatus, Finding, ProbeResult, Where

_CODES = {
    "corrupt": "cache-corrupt-entry",
    "incomplete": "cache-incomplete-entry",
    "orphan-tmp": "cache-orphan-tmp",
    "unreadable": "cache-unreadable-entry",
}
_FIX = {
    "corrupt": "`dflashdoctor cache fix` moves the entry into a quarantine (nothing is deleted); the next run "
    "recompiles or retunes it. `dflashdoctor cache restore` puts it back.",
    "incomplete": "`dflashdoctor cache fix` moves the dead files aside; triton recompiles the kernel anyway.",
    "orphan-tmp": "`dflashdoctor cache fix` moves it aside; nothing reads it.",
    "unreadable": "Give the user who trains read access (`chmod -R u+rX`, or `chown` to that user), or point the "
    "cache variable at a root of its own. `cache fix` leaves it: what it cannot read it cannot keep a copy of.",
}
_TITLES = {
    "corrupt": "Broken {kind} cache entry",
    "incomplete": "Interrupted {kind} compile",
    "orphan-tmp": "Leftover temporary {what} from an interrupted {kind} cache write",
    "unreadable": "Unreadable {kind} cache entry",
}


def shared_filesystem_finding(kind: str, path: str, facts: Mapping[str, object], evidence: dict[str, Any]) -> Finding:
    """One wording for `cache check` and `env`: the gate keeps one of the two for the same root."""
    return finding(
        "cache-shared-filesystem",
        f"{kind} cache {path} is on {facts['filesystem']} ({facts['mount_point']})",
        detail="Triton and Inductor write with rename and no lock; on network filesystems concurrent "
        "writers see EBUSY or FileNotFoundError, and slow metadata makes every lookup costly.",
        evidence=evidence,
        fix="Point TRITON_CACHE_DIR / TORCHINDUCTOR_CACHE_DIR at node-local disk (e.g. /tmp or NVMe).",
    )


def untrusted_root_finding(kind: str, path: str, reason: str, evidence: dict[str, Any]) -> Finding:
    """One wording for `cache check` and `env` (and so the gate): code another user could have put
    where torch.compile loads it from."""
    return finding(
        "cache-root-untrusted",
        f"{kind} cache {path} is {reason}",
        detail="torch.compile loads the generated code (Python modules, shared objects) it finds in its cache "
        "root: a root another user owns or can write into lets them run code in the next compiled process "
        "of whoever uses it. The default Inductor root sits in the world-writable temp folder, where anyone "
        "can make it first.",
        evidence=evidence,
        fix="Set TORCHINDUCTOR_CACHE_DIR / TRITON_CACHE_DIR to a folder of your own (not shared), or have the "
        "folder removed by its owner; do not compile with this root until then.",
    )


_NOT_BACK = ("missing", "conflict", "changed", "failed")  # restore outcomes that leave an entry out of place
_NOT_BACK_FIX = {
    "missing": "neither in the quarantine nor at its place: moved or removed by something else; look in the "
    "other quarantines beside the root",
    "conflict": "the place is taken by an entry rebuilt since: compare the two, remove the one you do not want, "
    "then restore again",
    "changed": "put back, but its files differ from the manifest: the quarantine was changed; the cache entry is "
    "suspect, `cache check` it",
    "failed": "could not be moved (see its detail): fix the permission or path, then restore again",
}


class CacheJudge(Judge):
    def __init__(self, observations: CacheObservations, budgets: Budgets) -> None:
        super().__init__("cache", budgets)
        self.scans = observations.scans
        self.facts = observations.facts  # root path -> environment facts
        self.log = observations.log
        self.moved = self.log.moved()  # entries a fix moved: reported once, as quarantined

    def judge(self) -> ProbeResult:
        for scan in self.scans:
            self._root(scan)
        for refusal in self.log.refusals:
            self._refused(refusal)
        for root, home, why in self.log.blocked:
            self._blocked(root, home, why)
        for root, run in self.log.fixed:
            self._quarantined(root, run)
        for run in self.log.restored:
            self._restored(run)
        for home in self.log.all_restored:
            self._check(f"restore {home}", "pass", "nothing left to restore: every quarantine there is restored")
        self.measurements["roots"] = [
            {k: v for k, v in s.to_dict().items() if k != "problems"} | {"problems": len(s.problems)}
            for s in self.scans
        ]
        self.measurements["entries_scanned"] = sum(s.entries for s in self.scans)
        self.measurements["files_scanned"] = sum(s.files for s in self.scans)
        self.measurements["bytes_scanned"] = sum(s.bytes for s in self.scans)
        self.measurements["scan_s"] = round(sum(s.seconds for s in self.scans), 3)
        self.measurements["broken_entries"] = sum(
            p.kind in _CODES for s in self.scans for p in s.problems if p.entry not in self.moved
        )
        return self.result()

    def _root(self, scan: RootScan) -> None:
        name = f"{scan.kind} {scan.path}"
        if not scan.exists:
            self._check(name, "skip", f"no cache here yet ({scan.source})")
            return
        live = [p for p in scan.problems if p.entry not in self.moved]
        for problem in live:
            if problem.kind in _CODES:
                self._problem(scan, problem)
        stale = [p for p in live if p.kind == "stale"]
        if stale:
            self._stale(scan, stale)
        before = len(self.findings)
        self._surroundings(scan)
        place = self.findings[before:]  # where the root lives: a network filesystem, no space, not writable
        broken = [p for p in live if p.kind in _CODES]
        failed = any(p.kind in ("corrupt", "unreadable") for p in broken) or any(f.severity == "error" for f in place)
        status: CheckStatus = "fail" if failed else "warn" if broken or place else "pass"
        summary = (
            f"{scan.entries} entries, {scan.files} files, {size_text(scan.bytes)} in {scan.seconds} s ({scan.source}); "
            + (f"{len(broken)} broken or left over" if broken else "entries intact" if place else "all intact")
            + (f"; {', '.join(f.title for f in place)}" if place else "")
        )
        self._check(name, status, summary, *sorted({_CODES[p.kind] for p in broken} | {f.code for f in place}))

    def _problem(self, scan: RootScan, problem: Problem) -> None:
        what = "folder" if not problem.entry.endswith(".tmp") else "file"
        self.findings.append(
            finding(
                _CODES[problem.kind],
                _TITLES[problem.kind].format(kind=scan.kind.capitalize(), what=what) + f": {problem.reason}",
                detail=f"{problem.entry} under {scan.kind} root {scan.path}.",
                where=Where(file=problem.entry),
                evidence={"root": scan.path, "entry": problem.entry, "reason": problem.reason, "files": problem.files},
                fix=_FIX[problem.kind],
            )
        )

    def _stale(self, scan: RootScan, stale: list[Problem]) -> None:
        self.findings.append(
            finding(
                "cache-stale-entry",
                f"{len(stale)} key folders under {scan.path} were compiled by another triton version",
                detail=f"{stale[0].reason}. Triton puts its version into every key, so these are never read; "
                "they only take space.",
                evidence={"root": scan.path, "entries": [p.entry for p in stale][:50], "count": len(stale)},
                fix="Nothing is broken. Remove them yourself if the space matters; `cache fix` leaves them.",
            )
        )

    def _surroundings(self, scan: RootScan) -> None:
        facts = self.facts.get(scan.path)
        if facts is None:  # not made yet: nothing around it to judge
            return
        evidence = {"root": scan.path, **facts}
        if facts.get("network_filesystem"):
            self.findings.append(shared_filesystem_finding(scan.kind, scan.path, facts, evidence))
        if untrusted := facts.get("untrusted"):
            self.findings.append(untrusted_root_finding(scan.kind, scan.path, untrusted, evidence))
        if facts.get("empty"):
            self.findings.append(
                finding(
                    "cache-relative-path",
                    f"{facts['source']} is set but empty: {scan.kind} caches into the current folder",
                    detail=f"An empty {facts['source']} is read as set (torch and triton take it as a relative "
                    f"path): every process writes its cache into the folder it started in ({scan.path} here), a "
                    "project's own folder as often as not, and `cache fix` refuses to move anything out of it.",
                    evidence=evidence,
                    fix=f"Unset {facts['source']}, or set it to an absolute path.",
                )
            )
        elif facts.get("relative"):
            self.findings.append(
                finding(
                    "cache-relative-path",
                    f"{scan.kind} cache root was given as a relative path ({facts['source']})",
                    detail="Triton's group files store child paths built from the cache dir string: a process "
                    "started in another directory misses every entry, or reads another tree's.",
                    evidence=evidence,
                    fix="Set the variable to an absolute path.",
                )
            )
        if facts.get("shared_by_ranks"):
            self.findings.append(
                finding(
                    "cache-shared-root",
                    f"{scan.kind} cache {scan.path} is shared by every rank of this job",
                    detail="World size "
                    + ", ".join(f"{k}={v}" for k, v in facts["shared_by_ranks"].items())
                    + " and the root does not name a rank: every rank writes the same files at once. Inductor's "
                    "autotune JSON has been seen corrupted this way under DDP/FSDP (JSONDecodeError).",
                    evidence=evidence,
                    fix="Give each rank its own root, e.g. TRITON_CACHE_DIR=/tmp/triton-$LOCAL_RANK.",
                )
            )
        if facts.get("low_space"):
            self.findings.append(
                finding(
                    "cache-low-space",
                    f"only {size_text(facts['free_bytes'])} free under {scan.path}",
                    detail="A compile that runs out of space leaves partial files; the next run reads them.",
                    evidence=evidence,
                    fix="Free space there or move the cache root.",
                )
            )
        if facts.get("writable") is False:
            self.findings.append(
                finding(
                    "cache-not-writable",
                    f"{scan.kind} cache {scan.path} cannot be written by this user",
                    detail="Triton creates a folder per kernel there; a compile then fails with PermissionError.",
                    evidence=evidence,
                    fix="Fix the ownership or permissions, or point the cache variable elsewhere.",
                )
            )

    def _left_status(self, root: str) -> CheckStatus:
        """fail when an error-level problem of `root` is still in place, else warn."""
        scan = next((s for s in self.scans if s.path == root), None)
        live = [p for p in (scan.problems if scan else []) if p.entry not in self.moved]
        return "fail" if any(p.kind in ("corrupt", "unreadable") for p in live) else "warn"

    def _refused(self, refusal: Refusal) -> None:
        count = len(refusal.reasons)
        self.findings.append(
            finding(
                "cache-quarantine-refused",
                f"Refused {refusal.path}: {refusal.reasons[0]}" + (f" (and {count - 1} more)" if count > 1 else ""),
                detail="Nothing of it was moved. fix and restore move files for whoever runs them, often root: a "
                "quarantine another user can write, or a manifest naming paths outside its cache root and its "
                "quarantine, could make them move files anywhere.",
                where=Where(file=refusal.path),
                evidence={"path": refusal.path, "reasons": refusal.reasons[:200], "count": count},
                fix="Look at who made it and what its manifest names before anything else. If it is your own, "
                "`chmod go-w` it; if not, move it out of the way (do not restore from it) and run `cache fix` again.",
            )
        )

    def _blocked(self, root: str, home: str, why: str) -> None:
        """A quarantine folder that could not be used. In a fix the broken entries it would have taken
        stay reported; in a restore the entries it holds stay out of place, which is an error."""
        restoring = not self.scans
        self._check(f"quarantine {home}", "fail" if restoring else self._left_status(root), f"{why}; nothing was moved")
        if restoring:
            self._refused(Refusal(home, [why]))

    def _quarantined(self, root: str, run: QuarantineRun) -> None:
        moved = [o for o in run.outcomes if o.state in ("moved", "already-moved")]
        failed = [o for o in run.outcomes if o.state == "failed"]
        self._check(
            f"quarantine {run.folder}",
            self._left_status(root) if failed else "pass",
            f"{len(moved)} entries moved from {root}" + (f"; {len(failed)} could not be moved" if failed else ""),
        )
        if moved:
            self.findings.append(
                finding(
                    "cache-quarantined",
                    f"{len(moved)} broken entries of {root} moved into {run.folder}",
                    detail="Each entry moved whole, with its files' sha256 and sizes in manifest.json.",
                    evidence=run.to_dict(),
                    fix=f"`dflashdoctor cache restore {run.folder}` puts them back byte-identical.",
                )
            )

    def _restored(self, run: QuarantineRun) -> None:
        counts: dict[str, int] = {}
        for outcome in run.outcomes:
            counts[outcome.state] = counts.get(outcome.state, 0) + 1
        out_of_place = [o for o in run.outcomes if o.state in _NOT_BACK]
        self._check(
            f"restore {run.folder}",
            "fail" if out_of_place else "pass",
            ", ".join(f"{v} {k}" for k, v in sorted(counts.items())),
            *(["cache-restore-incomplete"] if out_of_place else []),
        )
        self.findings.append(
            finding(
                "cache-restored",
                f"{counts.get('restored', 0)} entries restored from {run.folder}",
                detail="Every restored entry was compared file by file with its manifest (sha256 and size).",
                evidence=run.to_dict(),
            )
        )
        if out_of_place:
            states = sorted({o.state for o in out_of_place})
            first = out_of_place[0]
            self.findings.append(
                finding(
                    "cache-restore-incomplete",
                    f"{len(out_of_place)} entries of {run.folder} are not back as recorded ("
                    + ", ".join(f"{counts[s]} {s}" for s in states)
                    + f"); first: {first.original}: {first.detail or first.state}",
                    detail="A moved entry is still out of place, or came back different from its manifest.",
                    where=Where(file=first.original),
                    evidence={"folder": run.folder, "entries": [o.__dict__ for o in out_of_place][:200]},
                    fix=" ".join(f"{s}: {_NOT_BACK_FIX[s]}." for s in states),
                )
            )


def judge(observations: CacheObservations, budgets: Budgets) -> list[ProbeResult]:
    return [CacheJudge(observations, budgets).judge()]
