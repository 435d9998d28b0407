"""The cache judge on recorded `cache check|fix|restore` observations (tests/assets/observations/
record_cache_run.py made them with the real CLI): each finding code on the entry, path or root it is
about, with the severity codes.py gives it and the check status the root or quarantine gets.

The trees are cache_tree.healthy_tree's, so the key folder of kernel N is `key_for("kernel-N")`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from dflashdoctor.budgets import Budgets
from dflashdoctor.cache.environment import LOW_FREE_BYTES
from dflashdoctor.cache.observations import CacheObservations
from dflashdoctor.judges.cache import judge
from dflashdoctor.report import Check, ProbeResult
from tests.cache_tree import key_for
from tests.unit.recorded import codes, documented, found, judged, observations

CASES: dict[str, str] = {
    "cache-corrupt-entry": "cpu/cache-corrupt",
    "cache-unreadable-entry": "cpu/cache-unreadable",
    "cache-orphan-tmp": "cpu/cache-orphan-tmp",
    "cache-shared-filesystem": "cpu/cache-healthy",  # a variant: see VARIANTS
    "cache-incomplete-entry": "cpu/cache-incomplete",
    "cache-stale-entry": "cpu/cache-stale",
    "cache-relative-path": "cpu/cache-relative",
    "cache-shared-root": "cpu/cache-shared-root",
    "cache-low-space": "cpu/cache-low-space",
    "cache-not-writable": "cpu/cache-not-writable",
    "cache-quarantined": "cpu/cache-fix",
    "cache-restored": "cpu/cache-restore",
    "cache-restore-incomplete": "cpu/cache-restore-conflict",
    "cache-quarantine-refused": "cpu/cache-fix-refused",
    "cache-root-untrusted": "cpu/cache-healthy",  # a variant: see VARIANTS
}


def on_nfs(obs: CacheObservations) -> None:
    """No network filesystem can be mounted where the recordings are made: the healthy root's facts
    as inspect_root reads them from /proc/mounts when the root sits on an nfs4 mount."""
    (root,) = obs.facts
    obs.facts[root] |= {"filesystem": "nfs4", "mount_point": "/mnt/shared", "network_filesystem": True}


def made_by_another_user(obs: CacheObservations) -> None:
    """The healthy root as another user made it first (the facts inspect_root reads: the integration
    test makes it so as nobody, tests/integration/test_cache_trust.py)."""
    (root,) = obs.facts
    obs.facts[root] |= {"untrusted": "owned by nobody (uid 65534), not by root (uid 0), who runs this"}


VARIANTS: dict[str, Callable[[CacheObservations], None]] = {
    "cache-shared-filesystem": on_nfs,
    "cache-root-untrusted": made_by_another_user,
}


def test_a_root_another_user_made_fails_the_root():
    (section,) = results("cache-root-untrusted")
    (untrusted,) = found([section], "cache-root-untrusted")
    assert "owned by nobody" in untrusted.title and check(section, f"triton {root_of(section)}").status == "fail"


def results(code: str) -> list[ProbeResult]:
    """The judged recording of `code`, with its variant made."""
    obs = observations(CASES[code])
    VARIANTS.get(code, lambda _: None)(obs)
    return judge(obs, Budgets())


def check(section: ProbeResult, name: str) -> Check:
    (match,) = [c for c in section.checks if c.name == name]
    return match


def root_of(section: ProbeResult) -> Path:
    (root,) = [Path(r["path"]) for r in section.measurements["roots"] if r["exists"]]
    return root


@pytest.mark.parametrize("code", CASES)
def test_each_code_is_found_with_its_documented_severity(code):
    assert documented(results(code), code)


def test_the_healthy_tree_the_variant_starts_from_has_no_finding():
    (section,) = judged("cpu/cache-healthy")
    assert not section.findings and section.status == "pass"
    assert section.measurements["entries_scanned"] == 5 and section.measurements["broken_entries"] == 0


def test_a_truncated_binary_names_its_key_folder_and_fails_the_root():
    (section,) = results("cache-corrupt-entry")
    root = root_of(section)
    entry = str(root / key_for("kernel-1")[1])
    (corrupt,) = found([section], "cache-corrupt-entry")
    assert corrupt.where.file == entry == corrupt.evidence["entry"]
    assert corrupt.evidence["files"] == [f"{entry}/kernel_1.cubin"]
    assert "kernel_1.cubin: truncated" in corrupt.title and "cache fix" in corrupt.fix
    root_check = check(section, f"triton {root}")
    assert (root_check.status, root_check.codes) == ("fail", ["cache-corrupt-entry"])
    assert section.status == "fail" and section.measurements["broken_entries"] == 1
    assert codes([section]) == {"cache-corrupt-entry"}


def test_an_entry_this_user_cannot_read_is_named_and_not_called_corrupt():
    (section,) = results("cache-unreadable-entry")
    root = root_of(section)
    (unreadable,) = found([section], "cache-unreadable-entry")
    assert unreadable.where.file == str(root / key_for("kernel-0")[1])
    assert "Permission denied" in unreadable.evidence["reason"]
    assert check(section, f"triton {root}").status == "fail"
    assert codes([section]) == {"cache-unreadable-entry"}


def test_a_dead_writers_temp_folder_is_a_warning_on_that_folder():
    (section,) = results("cache-orphan-tmp")
    root = root_of(section)
    (orphan,) = found([section], "cache-orphan-tmp")
    tmp = root / key_for("kernel-0")[1] / "tmp.pid_999999999_0f3c7a1e-0000-4000-8000-000000000000"
    assert orphan.where.file == str(tmp) and orphan.title.startswith("Leftover temporary folder")
    assert "process 999999999, which is no longer running" in orphan.evidence["reason"]
    assert check(section, f"triton {root}").status == "warn" and section.status == "pass"


def test_a_key_folder_without_its_group_file_is_an_interrupted_compile():
    (section,) = results("cache-incomplete-entry")
    root = root_of(section)
    entry = root / key_for("kernel-0")[1]
    (incomplete,) = found([section], "cache-incomplete-entry")
    assert incomplete.where.file == str(entry) and "no group file" in incomplete.title
    assert {Path(f).name for f in incomplete.evidence["files"]} >= {"kernel_0.cubin", "kernel_0.json"}
    assert check(section, f"triton {root}").status == "warn"


def test_entries_of_another_triton_are_listed_and_nothing_is_broken():
    (section,) = results("cache-stale-entry")
    root = root_of(section)
    (stale,) = found([section], "cache-stale-entry")
    assert stale.evidence["entries"] == [str(root / key_for("old")[1])] and stale.evidence["count"] == 1
    assert "0.0.1" in stale.detail
    assert check(section, f"triton {root}").status == "pass" and section.measurements["broken_entries"] == 0


def test_a_relative_cache_variable_is_named():
    (section,) = results("cache-relative-path")
    (relative,) = found([section], "cache-relative-path")
    assert relative.evidence["source"] == "TRITON_CACHE_DIR" and relative.evidence["relative"] is True
    assert relative.evidence["root"].endswith("/rel-cache") and "(TRITON_CACHE_DIR)" in relative.title


def test_a_root_every_rank_writes_names_the_world_size():
    (section,) = results("cache-shared-root")
    (shared,) = found([section], "cache-shared-root")
    assert shared.evidence["shared_by_ranks"] == {"WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"}
    assert "WORLD_SIZE=2" in shared.detail and str(root_of(section)) in shared.title


def test_a_small_filesystem_under_the_root_is_low_on_space():
    (section,) = results("cache-low-space")
    (low,) = found([section], "cache-low-space")
    assert low.evidence["filesystem"] == "tmpfs" and 0 < low.evidence["free_bytes"] < LOW_FREE_BYTES
    assert low.title.startswith("only ") and low.title.endswith(f"free under {root_of(section)}")


def test_a_root_this_user_cannot_write_fails_the_section():
    (section,) = results("cache-not-writable")
    (denied,) = found([section], "cache-not-writable")
    assert denied.evidence["writable"] is False and denied.evidence["root"] == str(root_of(section))
    assert section.status == "fail"
    (root,) = [c for c in section.checks if c.name.endswith(str(root_of(section)))]
    assert root.status == "fail" and "cannot be written" in root.summary and "cache-not-writable" in root.codes


def test_a_root_on_nfs_names_the_mount():
    (section,) = results("cache-shared-filesystem")
    (shared,) = found([section], "cache-shared-filesystem")
    assert shared.title == f"triton cache {root_of(section)} is on nfs4 (/mnt/shared)"
    assert shared.evidence["network_filesystem"] is True and section.status == "pass"
    (root,) = [c for c in section.checks if c.name.endswith(str(root_of(section)))]
    assert root.status == "warn" and "entries intact; " in root.summary


def test_fix_moves_the_broken_entry_and_no_longer_reports_it():
    (section,) = results("cache-quarantined")
    root = root_of(section)
    (moved,) = found([section], "cache-quarantined")
    folder = Path(moved.evidence["folder"])
    assert folder.parent == root.parent / "triton.dflashdoctor-quarantine"
    (outcome,) = moved.evidence["outcomes"]
    assert (outcome["original"], outcome["state"]) == (str(root / key_for("kernel-1")[1]), "moved")
    assert "kernel_1.cubin: truncated" in outcome["detail"]
    assert check(section, f"quarantine {folder}").status == "pass"
    assert "cache-corrupt-entry" not in codes([section]) and section.measurements["broken_entries"] == 0


def test_restore_puts_the_entry_back():
    (section,) = results("cache-restored")
    (restored,) = found([section], "cache-restored")
    (outcome,) = restored.evidence["outcomes"]
    assert outcome["state"] == "restored" and outcome["original"].endswith("/triton/" + key_for("kernel-1")[1])
    assert check(section, f"restore {restored.evidence['folder']}").summary == "1 restored"
    assert section.status == "pass"


def test_a_restore_whose_place_is_taken_is_incomplete_and_fails():
    (section,) = results("cache-restore-incomplete")
    (incomplete,) = found([section], "cache-restore-incomplete")
    original = incomplete.evidence["entries"][0]["original"]
    assert original.endswith("/triton/" + key_for("kernel-1")[1]) and incomplete.where.file == original
    assert "(1 conflict)" in incomplete.title and incomplete.evidence["entries"][0]["state"] == "conflict"
    assert incomplete.fix.startswith("conflict: the place is taken")
    restore = check(section, f"restore {incomplete.evidence['folder']}")
    assert (restore.status, restore.summary, restore.codes) == ("fail", "1 conflict", ["cache-restore-incomplete"])
    (restored,) = found([section], "cache-restored")
    assert restored.title.startswith("0 entries restored")
    assert section.status == "fail"


def test_a_quarantine_folder_another_user_made_is_refused_and_nothing_moves():
    (section,) = results("cache-quarantine-refused")
    root = root_of(section)
    (refused,) = found([section], "cache-quarantine-refused")
    home = f"{root}.dflashdoctor-quarantine"
    assert refused.where.file == home == refused.evidence["path"]
    assert "owned by nobody (uid 65534)" in refused.title and refused.evidence["count"] == 1
    assert "Nothing of it was moved" in refused.detail
    (corrupt,) = found([section], "cache-corrupt-entry")  # still broken, still in place, still reported
    assert corrupt.where.file == str(root / key_for("kernel-1")[1])
    assert "cache-quarantined" not in codes([section]) and section.status == "fail"
