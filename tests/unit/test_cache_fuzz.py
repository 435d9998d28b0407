"""Property tests (Hypothesis) of what `cache fix` and `cache restore` believe: any JSON as a
manifest, and manifests full of `..`, absolute paths, wrong types and non-UTF-8 names over folder
trees with links, loops and dangling links inside the root and the quarantine. The parser never
raises anything but ManifestError; the commands never raise anything but BadInput, never change a
file outside the root and its quarantine, and never lose one inside them.

Examples are drawn from a fixed seed (`derandomize`), so every run tries the same ones.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import stat
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dflashdoctor.cache import manifest, quarantine
from dflashdoctor.commands.cache import CacheOptions, cache
from dflashdoctor.errors import BadInput
from tests import cache_tree

FUZZ = settings(max_examples=300, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
_OUR_FILES = {manifest.MANIFEST, quarantine.RESTORED, "lock"}  # what fix and restore write themselves

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)
KEY = cache_tree.key_for("fuzz")[1]  # a Triton key folder's name: what a fix may move (cache/layout.py)
names = st.sampled_from(["a", "b", "entries", "x.cubin", manifest.MANIFEST, "lock", "lat\udce9n", "K", KEY])
hostile_names = names | st.sampled_from(["..", ".", "", "a/b", "nul\0"])
tree_names = st.sampled_from(["a", "secret", "lat\udce9n", KEY])  # few, so that trees, links and manifests meet


@st.composite
def hostile_paths(draw: Any, base: str) -> Any:
    """A path as a manifest might hold it: (where, names) to be made real below a sandbox folder, or
    a raw value of any type."""
    kind = draw(st.sampled_from(["below", "hostile", "outside", "raw"]))
    if kind == "raw":
        return ("raw", draw(st.one_of(st.text(max_size=16), st.integers(), st.none(), st.lists(st.text(max_size=3)))))
    parts = draw(st.lists(hostile_names if kind == "hostile" else names, min_size=1, max_size=4))
    return ("outside" if kind == "outside" else base, parts)


file_records = st.one_of(
    st.fixed_dictionaries({"path": st.text(max_size=6), "size": st.integers(-2, 9), "sha256": st.text(max_size=4)}),
    st.fixed_dictionaries({"path": st.text(max_size=6), "link": st.text(max_size=6)}),
    json_values,
)
manifest_entries = st.fixed_dictionaries(
    {"original": hostile_paths("root"), "stored": hostile_paths("stored"), "files": st.lists(file_records, max_size=2)},
    optional={"reason": json_values, "kind": json_values},
)
# what a tree may hold: (area, names, what); links point at these
link_targets = st.sampled_from(
    ["outside", "outside/secret", "root", "..", "../..", "../../..", "loop", "missing", "up"]
)
tree_items = st.tuples(
    st.sampled_from(["root", "stored", "outside"]),
    st.lists(tree_names, min_size=1, max_size=3),
    st.one_of(st.just("file"), st.just("folder"), link_targets.map(lambda t: f"link:{t}")),
)


def test_manifest_parser_is_total():
    @FUZZ
    @given(
        st.one_of(
            json_values,
            st.fixed_dictionaries(
                {"schema": st.just(manifest.SCHEMA)},
                optional={
                    "root": st.one_of(st.just("/r"), st.text(max_size=6), st.integers()),
                    "entries": st.one_of(st.lists(manifest_entries, max_size=4), json_values),
                },
            ),
        )
    )
    def parse_anything(value):
        value = _materialised(value, Path("/r"), Path("/q"), Path("/o"))
        try:
            parsed = manifest.parse(value)
        except manifest.ManifestError:
            return
        for entry in parsed.entries:
            assert "/".join((parsed.root.rstrip("/"), *entry.below_root)) == entry.original
            assert entry.stored[0] == manifest.ENTRIES and len(entry.stored) >= 2
            assert all(
                n not in ("", ".", "..") and "/" not in n and "\0" not in n for n in entry.below_root + entry.stored
            )
        assert len(parsed.entries) + len(parsed.refused) == len(value["entries"])

    parse_anything()


def test_manifest_bytes_never_crash_the_reader():
    @FUZZ
    @given(st.binary(max_size=64) | json_values.map(lambda v: json.dumps(v).encode()))
    def read_anything(raw):
        with contextlib.suppress(manifest.ManifestError):
            manifest.loads(raw)

    read_anything()
    with pytest.raises(manifest.ManifestError):  # past the recursion limit: a RecursionError inside json
        manifest.loads(b"[" * 100_000)


def _materialised(value: Any, root: Path, stored_in: Path, outside: Path) -> Any:
    """Turns the (where, names) paths drawn above into strings below the sandbox's folders."""
    if isinstance(value, tuple):
        where, raw = value
        if where == "raw":
            return raw
        if where == "stored":
            return "/".join([manifest.ENTRIES, *raw])
        return "/".join([str({"root": root, "outside": outside}[where]), *raw])
    if isinstance(value, dict):
        return {k: _materialised(v, root, stored_in, outside) for k, v in value.items()}
    if isinstance(value, list):
        return [_materialised(v, root, stored_in, outside) for v in value]
    return value


def _plant(sandbox: Path, areas: dict[str, Path], items: list[tuple[str, list[str], str]]) -> None:
    """Makes each item, never through a link an earlier item made (that would write anywhere, `/`
    included); an item whose place is taken, or lies past a link or a file, is left out."""
    for area, parts, what in items:
        path = areas[area].joinpath(*parts)
        on_the_way = [areas[area].joinpath(*parts[:i]) for i in range(1, len(parts) + 1)]
        if any(p.is_symlink() for p in on_the_way) or os.path.lexists(path):
            continue
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError:  # a file where a folder would go
            continue
        if what == "file":
            path.write_bytes(hashlib.sha256(str(path).encode("utf-8", "surrogateescape")).digest())
        elif what == "folder":
            path.mkdir()
        else:
            target = what.removeprefix("link:")
            special = {"loop": path, "up": sandbox.parent}
            path.symlink_to(special.get(target) or (target if target.startswith(".") else sandbox / target))


def _records(top: Path, parts: list[str]) -> list[dict[str, Any]]:
    """The manifest's file records of a planted one-file entry, as a fix would have written them."""
    path = top.joinpath(*parts)
    if path.is_symlink() or not path.is_file():
        return []
    data = path.read_bytes()
    return [{"path": ".", "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}]


def _tree(top: Path) -> Counter:
    """Every file and link under `top` as content, not place: what must be neither lost nor added."""
    found: Counter = Counter()
    for folder, dirs, files in os.walk(top):
        for name in [*files, *dirs]:
            path = Path(folder, name)
            if path.is_symlink():
                found["link", os.readlink(path)] += 1
            elif name not in _OUR_FILES and not name.endswith(".tmp") and stat.S_ISREG(path.lstat().st_mode):
                found["file", hashlib.sha256(path.read_bytes()).hexdigest()] += 1
    return found


def _exact(top: Path, inside: tuple[Path, ...]) -> dict[str, tuple]:
    """Every file, folder and link under `top` but not in `inside`, by place, with contents and modes."""
    out = {}
    for folder, dirs, files in os.walk(top):
        dirs[:] = [d for d in dirs if Path(folder, d) not in inside]
        for name in [*files, *dirs]:
            path = Path(folder, name)
            info = path.lstat()
            body = os.readlink(path) if path.is_symlink() else path.read_bytes() if path.is_file() else None
            out[str(path)] = (stat.S_IFMT(info.st_mode), stat.S_IMODE(info.st_mode), body)
    return out


def test_fix_and_restore_never_move_a_file_outside_the_root_and_its_quarantine():
    seen: Counter = Counter()  # what the examples did, so the property is shown not to hold vacuously

    @FUZZ
    @given(
        manifest_entries_list=st.just([]) | st.lists(manifest_entries, max_size=5),  # empty: the sound ones alone
        sound=st.lists(st.lists(tree_names, min_size=1, max_size=3), max_size=3),
        detours=st.lists(st.tuples(st.sampled_from(["root", "stored"]), tree_names, link_targets), max_size=2),
        honest=st.booleans(),
        right_root=st.booleans(),
        items=st.lists(tree_items, max_size=10),
        kernels=st.integers(0, 3),
        broken=st.sets(st.integers(0, 2), max_size=3),
        cache_top=st.booleans(),
        action=st.sampled_from(["restore", "fix", "restore-named"]),
    )
    def run_hostile(
        manifest_entries_list, sound, detours, honest, right_root, items, kernels, broken, cache_top, action
    ):
        with tempfile.TemporaryDirectory() as top:
            sandbox = Path(top, "up", "sandbox")  # links reach `up` and `top` too: escapes there are seen
            root, outside = sandbox / "root", sandbox / "outside"
            home = quarantine.home_of(root)
            folder = home / "20261201T000000.000000Z"
            for path in (root, outside, folder):
                path.mkdir(parents=True, mode=0o700)
            (outside / "secret").write_text("not to be moved")
            folders = [cache_tree.write_kernel(root, f"k{i}") for i in range(kernels)]
            for i in broken & set(range(kernels)):
                cache_tree.truncate_binary(folders[i])
            # a root whose top holds other names than a cache's is refused by fix: so half the trees go
            # into a key folder, where fix may move them
            planted_root = root / KEY if cache_top else root
            areas = {"root": planted_root, "stored": folder / manifest.ENTRIES, "outside": outside}
            # links on the way of the sound entries below: a move that followed one would leave the tree
            _plant(sandbox, areas, [(area, [name], f"link:{target}") for area, name, target in detours])
            # entries a fix could have written: their stored file exists (and may yet be refused)
            _plant(sandbox, areas, [("stored", parts, "file") for parts in sound])
            _plant(sandbox, areas, items)
            stored_area = areas["stored"]
            entries = [
                {"original": ("root", p), "stored": ("stored", p), "files": _records(stored_area, p) if honest else []}
                for p in sound
            ]
            data = {
                "schema": manifest.SCHEMA,
                "root": str(root if right_root else outside),
                "kind": "triton",
                "entries": _materialised(entries + manifest_entries_list, root, folder, outside),
            }
            (folder / manifest.MANIFEST).write_text(json.dumps(data))
            outside_before, inside_before = _exact(Path(top), (root, home)), _tree(root) + _tree(home)
            command = "fix" if action == "fix" else "restore"
            named = folder if action == "restore-named" else None
            try:
                report = cache(CacheOptions(command, triton_dir=root, quarantine=named), ["dflashdoctor", "cache"])
            except BadInput:
                report, seen["bad input"] = None, seen["bad input"] + 1
            assert _exact(Path(top), (root, home)) == outside_before  # outside, the sandbox and above it
            assert _tree(root) + _tree(home) == inside_before
            if report is not None:
                json.dumps(report.to_dict(), default=str)  # the report serialises, whatever the names
                for found in report.findings():
                    seen[found.code] += 1
                    for outcome in found.evidence.get("outcomes", []):
                        seen[outcome["state"]] += 1

    run_hostile()
    for what in ("cache-quarantine-refused", "moved", "restored", "bad input"):
        assert seen[what] >= 3, seen
    assert seen["changed"] + seen["conflict"] + seen["missing"] >= 3, seen
