"""`cache fix` and `cache restore` run as root against what another local user (nobody, through
setpriv) planted: a quarantine folder made first in a world-writable folder, manifests naming paths
outside the root and the quarantine, links on the way, wrong types. Each is refused by name, and
nothing moves; permission errors are findings, never a crash."""

from __future__ import annotations

import json
import os
import shlex
import signal
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from dflashdoctor.cache import manifest, quarantine
from dflashdoctor.commands.cache import CacheOptions, cache
from dflashdoctor.errors import BadInput
from tests import cache_tree
from tests.conftest import as_nobody, permissions_apply, run_cli

STAMP = "20261201T000000.000000Z"


def _entry(original: object, stored: object, files: object = ()) -> dict:
    return {"original": original, "stored": stored, "files": list(files), "kind": "corrupt", "reason": "planted"}


def _manifest(root: Path, entries: list[dict]) -> str:
    return json.dumps({"schema": manifest.SCHEMA, "root": str(root), "kind": "inductor", "entries": entries})


def _victims(tmp_path: Path) -> tuple[Path, Path]:
    """A folder only root may enter, and a mode-600 file of root's in another."""
    root_only = tmp_path / "root-only"
    root_only.mkdir(mode=0o700)
    victim = tmp_path / "victim"
    victim.mkdir(mode=0o700)
    secret = victim / "secret.txt"
    secret.write_text("root's secret\n")
    secret.chmod(0o600)
    return root_only, secret


def _default_roots_in(tmp_path: Path, shared: Path) -> dict[str, str | None]:
    """An environment whose default Inductor root is in `shared`, as it is in /tmp. Inductor sets
    TORCHINDUCTOR_CACHE_DIR in the environment of a process that compiled (this one may have), so the
    variable is removed."""
    return {"TMPDIR": str(shared), "TORCHINDUCTOR_CACHE_DIR": None, "TRITON_CACHE_DIR": str(tmp_path / "triton-unused")}


def _plain_restore(tmp_path: Path, shared: Path, *args: str):
    """`dflashdoctor cache restore` with no root named: the default Inductor root in the temp folder."""
    return run_cli(tmp_path, "cache", "restore", *args, env=_default_roots_in(tmp_path, shared))


def _untouched(root_only: Path, secret: Path, drop: Path) -> None:
    assert not (root_only / "planted.sh").exists()
    assert secret.read_text() == "root's secret\n" and stat.S_IMODE(secret.stat().st_mode) == 0o600
    assert not any(drop.iterdir())


def test_restore_refuses_a_quarantine_another_user_made_first(tmp_path, shared):
    """The attack from the issue: nobody makes the default Inductor root's quarantine folder first and
    plants a manifest that moves a script into a root-only folder and root's secret out to nobody."""
    root = shared / "torchinductor_root"
    root.mkdir()
    root_only, secret = _victims(tmp_path)
    drop, home = shared / "drop", quarantine.home_of(root)
    folder = home / STAMP
    manifest = _manifest(
        root,
        [
            _entry(str(root_only / "planted.sh"), "entries/planted.sh"),
            _entry(str(drop / "secret.txt"), os.path.relpath(secret, folder)),
        ],
    )
    as_nobody(
        f"mkdir -p {folder}/entries {drop}; printf '#!/bin/sh\\nid\\n' > {folder}/entries/planted.sh; "
        f"chmod 755 {folder}/entries/planted.sh; printf %s {shlex.quote(manifest)} > {folder}/manifest.json"
    )
    run = _plain_restore(tmp_path, shared)
    assert run.code == 1, run.stdout + run.stderr
    (refused,) = run.findings("cache-quarantine-refused")
    assert refused["where"]["file"] == str(home)
    assert "owned by nobody (uid 65534), not by root (uid 0)" in refused["title"]
    _untouched(root_only, secret, drop)
    assert (folder / "entries" / "planted.sh").is_file()  # nobody's files stay where nobody put them
    assert run.report["verdict"] == "fail"


def test_a_manifest_another_user_wrote_into_a_loose_quarantine_is_refused(tmp_path, shared):
    """Root's own quarantine folder, left writable by others: nobody writes the manifest into it."""
    root = shared / "torchinductor_root"
    root.mkdir()
    root_only, secret = _victims(tmp_path)
    drop, home = shared / "drop", quarantine.home_of(root)
    folder = home / STAMP
    folder.mkdir(parents=True)
    folder.chmod(0o777)
    manifest = _manifest(root, [_entry(str(drop / "secret.txt"), os.path.relpath(secret, folder))])
    as_nobody(f"mkdir -p {drop}; printf %s {shlex.quote(manifest)} > {folder}/manifest.json")
    run = _plain_restore(tmp_path, shared)
    assert run.code == 1, run.stdout + run.stderr
    (refused,) = run.findings("cache-quarantine-refused")
    assert refused["where"]["file"] == str(folder)
    assert "writable by its group and others (mode 777)" in refused["title"]
    _untouched(root_only, secret, drop)


def test_fix_refuses_a_quarantine_folder_another_user_made_first(tmp_path, shared):
    """nobody makes the folder `fix` would quarantine into: fix refuses it, moves nothing, leaves
    nothing of its own in it, and the broken entries stay reported."""
    root = shared / "triton"
    folders = cache_tree.healthy_tree(root, 4)
    broken = cache_tree.truncate_binary(folders[1])
    home = quarantine.home_of(root)
    as_nobody(f"mkdir -m 700 {home}")
    run = run_cli(tmp_path, "cache", "fix", "--triton-dir", str(root))
    assert run.code == 1, run.stdout + run.stderr
    (refused,) = run.findings("cache-quarantine-refused")
    assert refused["where"]["file"] == str(home) and "owned by nobody" in refused["title"]
    assert [f["where"]["file"] for f in run.findings("cache-corrupt-entry")] == [str(broken)]
    assert broken.is_dir() and home.stat().st_uid == 65534
    assert not os.listdir(home) and not run.findings("cache-quarantined")


def test_a_quarantine_folder_that_is_a_link_is_refused(tmp_path, shared):
    root = shared / "triton"
    folders = cache_tree.healthy_tree(root, 2)
    cache_tree.truncate_binary(folders[0])
    as_nobody(f"mkdir {shared}/mine; ln -s {shared}/mine {quarantine.home_of(root)}")
    run = run_cli(tmp_path, "cache", "fix", "--triton-dir", str(root))
    assert run.code == 1, run.stdout + run.stderr
    (refused,) = run.findings("cache-quarantine-refused")
    assert "a symbolic link (never followed)" in refused["title"]
    assert folders[0].is_dir() and not os.listdir(shared / "mine")


def test_fix_refuses_a_default_root_another_user_linked_elsewhere(tmp_path, shared):
    """nobody links the default Inductor root's name in the temp folder to a folder of root's: the
    scan reads through it (reading is harmless), but fix moves nothing out of it."""
    private = cache_tree.generated_path(tmp_path / "root-only", "planted", "json")
    private.write_text("{not json")  # what an Inductor scan calls a broken entry
    as_nobody(f"ln -s {private.parent.parent} {shared}/torchinductor_root")
    run = run_cli(tmp_path, "cache", "fix", env=_default_roots_in(tmp_path, shared))
    assert run.code == 1, run.stdout + run.stderr
    (refused,) = run.findings("cache-quarantine-refused")
    assert refused["where"]["file"] == str(shared / "torchinductor_root")
    assert "a link made by nobody (uid 65534) in a world-writable folder" in refused["title"]
    planted = shared / "torchinductor_root" / private.parent.name / private.name
    assert [f["where"]["file"] for f in run.findings("cache-corrupt-entry")] == [str(planted)]
    assert private.read_text() == "{not json"
    assert not quarantine.home_of(shared / "torchinductor_root").exists()


def _own_quarantine(tmp_path: Path) -> tuple[Path, Path]:
    """A real quarantine made by `cache fix` as this user: (root, its quarantine folder)."""
    root = tmp_path / "triton"
    folders = cache_tree.healthy_tree(root, 3)
    cache_tree.truncate_binary(folders[0])
    fixed = run_cli(tmp_path, "cache", "fix", "--triton-dir", str(root))
    assert fixed.code == 0, fixed.stdout + fixed.stderr
    (moved,) = fixed.findings("cache-quarantined")
    return root, Path(moved["evidence"]["folder"])


def test_our_own_quarantine_is_private(tmp_path):
    root, folder = _own_quarantine(tmp_path)
    for path in (quarantine.home_of(root), folder, folder / "entries"):
        assert stat.S_IMODE(path.stat().st_mode) == 0o700, path
    assert stat.S_IMODE((folder / "manifest.json").stat().st_mode) == 0o600


def test_every_entry_that_leads_outside_is_refused_and_nothing_of_that_manifest_moves(tmp_path):
    """A manifest in a quarantine of our own (as a bug or an edit could leave it): each entry whose
    paths leave the root or the quarantine is refused with its reason, and even the sound entry stays."""
    root, folder = _own_quarantine(tmp_path)
    root_only, secret = _victims(tmp_path)
    data = json.loads((folder / "manifest.json").read_text())
    (sound,) = data["entries"]
    (root / "linked").symlink_to(root_only)
    (folder / "entries" / "linked").symlink_to(secret.parent)
    hostile = [
        _entry(str(root_only / "planted.sh"), "entries/planted.sh"),
        _entry(str(root / ".." / "root-only" / "x"), "entries/x"),
        _entry(str(root / "KEY"), "../../../victim/secret.txt"),
        _entry(str(root / "KEY"), str(secret)),
        _entry(str(root / "KEY"), "entries/../../x"),
        _entry(str(root / "linked" / "planted.sh"), "entries/y"),
        _entry(str(root / "KEY2"), "entries/linked/secret.txt"),
        _entry(5, "entries/z"),
        _entry(str(root / "KEY3"), ["entries", "z"]),
        _entry(str(root / "KEY4"), "entries/w", files=[{"path": 1}]),
        "not an object",
    ]
    data["entries"] = [sound, *hostile]
    (folder / "manifest.json").write_text(json.dumps(data))
    before = cache_tree.snapshot(tmp_path / "victim")
    run = run_cli(tmp_path, "cache", "restore", "--triton-dir", str(root))
    assert run.code == 1, run.stdout + run.stderr
    (refused,) = run.findings("cache-quarantine-refused")
    assert refused["where"]["file"] == str(folder / "manifest.json")
    reasons = refused["evidence"]["reasons"]
    assert len(reasons) == len(hostile), reasons
    assert [int(r.split()[1].rstrip(":")) for r in reasons] == list(range(1, len(hostile) + 1))
    assert any("a symbolic link (never followed)" in r for r in reasons)
    assert Path(sound["original"]).exists() is False  # the sound entry was not put back either
    assert (folder / sound["stored"]).is_dir()
    assert cache_tree.snapshot(tmp_path / "victim") == before and not any(root_only.iterdir())


def test_wrong_types_in_a_named_manifest_are_a_finding_not_a_crash(tmp_path):
    root, folder = _own_quarantine(tmp_path)
    data = json.loads((folder / "manifest.json").read_text())
    data["entries"][0]["original"] = 5
    (folder / "manifest.json").write_text(json.dumps(data))
    run = run_cli(tmp_path, "cache", "restore", str(folder))
    assert run.code == 1, run.stdout + run.stderr
    (refused,) = run.findings("cache-quarantine-refused")
    assert "entry 0: original 5 is not a path inside the root" in refused["title"]
    data["entries"] = {"not": "a list"}
    (folder / "manifest.json").write_text(json.dumps(data))
    named = run_cli(tmp_path, "cache", "restore", str(folder))
    assert named.code == 2 and named.stderr.count("\n") == 1, named.stderr
    assert "is not a readable quarantine manifest (its entries are not a list)" in named.stderr
    plain = run_cli(tmp_path, "cache", "restore", "--triton-dir", str(root))  # found, not named: a finding
    assert plain.code == 1 and plain.findings("cache-quarantine-refused"), plain.stdout + plain.stderr


def test_fix_where_no_quarantine_can_be_made_is_a_finding(tmp_path):
    """A read-only folder above the root: the quarantine cannot be made beside it. The broken entry
    stays reported, the check says why nothing moved, and the exit code is 1, not 3."""
    prefix = permissions_apply(tmp_path)
    parent = tmp_path / "read-only"
    root = parent / "triton"
    folders = cache_tree.healthy_tree(root, 3)
    broken = cache_tree.truncate_binary(folders[0])
    parent.chmod(0o555)
    try:
        run = run_cli(tmp_path, "cache", "fix", "--triton-dir", str(root), prefix=prefix)
    finally:
        parent.chmod(0o755)
    assert run.code == 1, run.stdout + run.stderr
    check = run.check(f"quarantine {quarantine.home_of(root)}")
    assert check["status"] == "fail" and "Permission denied" in check["summary"]
    assert [f["where"]["file"] for f in run.findings("cache-corrupt-entry")] == [str(broken)]
    assert broken.is_dir() and not quarantine.home_of(root).exists()


HOLD_LOCK = """
import sys, time
from pathlib import Path
from dflashdoctor.cache.quarantine import QuarantineHome

with QuarantineHome.open(Path(sys.argv[1]), create=True) as home, home.lock(10):
    print("locked", flush=True)
    time.sleep(600)
"""


def _holder(root: Path) -> subprocess.Popen:
    child = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(HOLD_LOCK), str(root)], stdout=subprocess.PIPE, text=True
    )
    assert child.stdout.readline().strip() == "locked"
    return child


def test_a_second_run_stops_with_one_line_naming_the_holder_and_goes_on_once_it_is_killed(tmp_path):
    root = tmp_path / "triton"
    folders = cache_tree.healthy_tree(root, 3)
    broken = cache_tree.truncate_binary(folders[0])
    holder = _holder(root)
    try:
        run = run_cli(tmp_path, "cache", "fix", "--triton-dir", str(root), "--wait", "0.5")
        assert run.code == 2, run.stdout + run.stderr
        assert run.stderr.count("\n") == 1 and f"is locked by pid {holder.pid}" in run.stderr, run.stderr
        assert broken.is_dir()
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    run = run_cli(tmp_path, "cache", "fix", "--triton-dir", str(root), "--wait", "5")  # kill -9 freed it
    assert run.code == 0, run.stdout + run.stderr
    assert not broken.exists()


@pytest.mark.parametrize("wait", ["nan", "-1", "x"])
def test_a_wait_that_is_not_seconds_is_bad_input(tmp_path, wait):
    """Typer refuses these itself in the releases tried; the command checks nan too, for older ones
    (click's FloatRange lets nan through), and for callers of the API."""
    run = run_cli(tmp_path, "cache", "fix", "--triton-dir", str(tmp_path), "--wait", wait)
    assert run.code == 2 and run.stderr.count("\n") == 1 and "--wait" in run.stderr, run.stderr


def test_the_api_refuses_a_nan_wait(tmp_path):
    options = CacheOptions("fix", triton_dir=tmp_path, wait_s=float("nan"))
    with pytest.raises(BadInput, match="--wait must be a finite number of seconds, not nan"):
        cache(options, ["dflashdoctor", "cache", "fix"])


def _team_folder(shared: Path) -> Path:
    """A team scratch folder root owns, that nobody's group may write (mode 2775)."""
    team = shared / "team"
    team.mkdir()
    os.chown(team, 0, 65534)
    team.chmod(0o2775)
    return team


def test_fix_refuses_a_root_a_teammate_swapped_for_a_link(tmp_path, shared):
    """nobody, who may write the team folder, moves root's Triton root aside and links its name to a
    folder of nobody's holding a broken entry: fix would carry nobody's files into root's quarantine
    (and restore them wherever the manifest says). It refuses the root, moves nothing."""
    team = _team_folder(shared)
    root = team / "triton"
    cache_tree.healthy_tree(root, 2)
    theirs = shared / "theirs"
    broken = cache_tree.healthy_tree(theirs, 2)[0]
    cache_tree.truncate_binary(broken)  # an entry fix would move
    subprocess.run(["chown", "-R", "65534:65534", str(theirs)], check=True)
    before = sorted(p.name for p in broken.iterdir())
    as_nobody(f"mv {root} {team}/old; ln -s {theirs} {root}")
    run = run_cli(tmp_path, "cache", "fix", "--triton-dir", str(root))
    assert run.code == 1, run.stdout + run.stderr
    (refused,) = run.findings("cache-quarantine-refused")
    assert refused["where"]["file"] == str(root) and "another user could have swapped it" in refused["title"]
    assert sorted(p.name for p in broken.iterdir()) == before  # nothing of nobody's moved
    assert not run.findings("cache-quarantined")


def test_fix_refuses_a_root_a_teammate_replaced_with_a_folder_of_theirs(tmp_path, shared):
    team = _team_folder(shared)
    root = team / "inductor"
    key = cache_tree.inductor_key("planted")
    shard, planted = key[1:3], f"{key[1:3]}/{key}.json"  # a generated file's place: a broken entry
    (root / shard).mkdir(parents=True)
    as_nobody(f"mv {root} {team}/old; mkdir -p {root}/{shard}; printf '{{not json' > {root}/{planted}")
    run = run_cli(tmp_path, "cache", "fix", "--inductor-dir", str(root))
    assert run.code == 1, run.stdout + run.stderr
    (refused,) = run.findings("cache-quarantine-refused")
    assert "owned by nobody (uid 65534)" in refused["title"]
    assert (root / planted).read_text() == "{not json"


def test_a_link_root_in_a_folder_only_its_owner_writes_is_still_followed(tmp_path):
    """The user's own setup (a cache root linked to a scratch disk from a private folder) is theirs."""
    real = tmp_path / "scratch" / "triton"
    folders = cache_tree.healthy_tree(real, 3)
    cache_tree.truncate_binary(folders[0])
    (tmp_path / "home").mkdir(mode=0o755)
    (tmp_path / "home" / "triton").symlink_to(real)
    run = run_cli(tmp_path, "cache", "fix", "--triton-dir", str(tmp_path / "home" / "triton"))
    assert run.code == 0, run.stdout + run.stderr
    assert run.findings("cache-quarantined") and not run.findings("cache-quarantine-refused")


@pytest.mark.parametrize("command", [("cache", "check"), ("env",)])
def test_a_default_inductor_root_another_user_made_first_is_an_error(tmp_path, shared, command):
    """nobody makes root's default Inductor root in the temp folder first and plants generated code in
    it: the next torch.compile of root's would load it. cache check and env say so (error); before,
    both passed."""
    root = shared / "torchinductor_root"
    as_nobody(f"mkdir -p {root}/ab; printf 'import os\\n' > {root}/ab/cabcdef.py")
    run = run_cli(tmp_path, *command, env=_default_roots_in(tmp_path, shared))
    assert run.code == 1, run.stdout[-2000:] + run.stderr
    (untrusted,) = run.findings("cache-root-untrusted")
    assert untrusted["severity"] == "error" and str(root) in untrusted["title"]
    assert "owned by nobody (uid 65534)" in untrusted["title"]
