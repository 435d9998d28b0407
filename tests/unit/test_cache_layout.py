"""The layout rule of cache/layout.py on names: what Inductor and Triton write passes, a lookalike of
another shape does not."""

from __future__ import annotations

import pytest

from dflashdoctor.cache.layout import cache_root_of, is_cache_entry, not_a_cache, written_by_a_cache
from tests import cache_tree

CODE = cache_tree.inductor_key("kernel")  # `c` + 51 of lowercase base32, as torch makes it
SHARD = CODE[1:3]
GRAPH = "f" + CODE[1:]
TRITON = cache_tree.key_for("kernel")[1]


@pytest.mark.parametrize(
    ("kind", "path"),
    [
        ("inductor", f"{SHARD}/{CODE}.py"),
        ("inductor", f"{SHARD}/{CODE}.main.cpp"),
        ("inductor", f"{SHARD}/{CODE}.best_config"),
        ("inductor", f"{SHARD}/.4242.139812.tmp"),
        ("inductor", f"fxgraph/{SHARD}/{GRAPH}"),
        ("inductor", f"fxgraph/{SHARD}/{GRAPH}/.4242.139812.tmp"),
        ("inductor", f"aotautograd/a{CODE[1:]}"),
        ("triton", TRITON),
        ("triton", f"{TRITON}/tmp.pid_4242_0f3c7a1e-0000-4000-8000-000000000000"),
    ],
)
def test_what_the_libraries_write_is_an_entry(kind, path):
    assert is_cache_entry(kind, tuple(path.split("/")))


@pytest.mark.parametrize(
    ("kind", "path"),
    [
        ("inductor", "pkg/bad.py"),  # the report's project
        ("inductor", "settings.json"),
        ("inductor", f"{SHARD}/settings.json"),  # a shard's files are named by their key
        ("inductor", f"{SHARD}/{CODE}"),  # no extension: get_path always adds one
        ("inductor", f"zz/{CODE}.py"),  # in another key's shard
        ("inductor", f"{SHARD}/{CODE}.py\n"),  # `$` would take the newline
        ("inductor", f"{SHARD}/{CODE.upper()}.py"),
        ("inductor", f"fxgraph/zz/{GRAPH}"),
        ("inductor", f"fxgraph/{SHARD}/{GRAPH}/notes.txt"),
        ("inductor", f"dynamo/{CODE}.py"),  # Inductor's folder, but no entry of the layout
        ("inductor", TRITON),  # a Triton key is no Inductor entry
        ("triton", f"{SHARD}/{CODE}.py"),
        ("triton", f"{TRITON}/sub"),
        ("triton", TRITON.lower()),
        ("manifest-kind", TRITON),  # a manifest of another kind names no entry
    ],
)
def test_a_lookalike_is_not_an_entry(kind, path):
    assert not is_cache_entry(kind, tuple(path.split("/")))


def test_a_root_is_judged_by_its_top(tmp_path):
    assert not_a_cache(tmp_path) is None  # empty: a cache not written yet
    for folder in (SHARD, "fxgraph", "aotautograd", "locks", "triton", "cache", "dynamo", TRITON, "tmpa1b2c3d_"):
        (tmp_path / folder).mkdir()
    for name in ("memoizer_cache.json", "tmpa1b2c3d_.py"):
        (tmp_path / name).write_text("")
    assert not_a_cache(tmp_path) is None
    (tmp_path / "settings.json").write_text("{}")
    (tmp_path / "pkg").mkdir()
    assert not_a_cache(tmp_path) == (
        "its top holds pkg, settings.json, which neither Inductor nor Triton writes: not a cache root"
    )
    (tmp_path / "fxgraph.py").write_text("")  # a known folder's name as a file is not it
    (tmp_path / "src").mkdir()
    assert "holds fxgraph.py, pkg, settings.json and 1 more," in (not_a_cache(tmp_path) or "")


KEY = "cwruqerddvgygrtuygr2yxfz6ktbzkyzedyyy6jfxxu3kp5puvlp"  # a key torch 2.13 wrote (codecache.get_path)


@pytest.mark.parametrize(
    ("path", "written", "root"),
    [
        (f"/tmp/torchinductor_u/wr/{KEY}.py", True, ("inductor", "/tmp/torchinductor_u")),
        (f"C:\\cache\\wr\\{KEY}.py", True, ("inductor", "C:/cache")),
        (f"{KEY}.py", True, None),  # SyntaxError names the file alone: written, no root to check
        (f"/tmp/x/ab/{KEY}.py", False, None),  # the shard is not the key's letters 1-2
        (f"wr/{KEY}.py", True, None),  # relative: the part of a longer path a message showed
        (f"/home/u/.triton/cache/{'A' * 52}/rms_norm_kernel.json", True, ("triton", "/home/u/.triton/cache")),
        ("/home/u/project/model.py", False, None),
    ],
)
def test_a_written_files_path_and_its_cache_root_come_from_the_layout(path, written, root):
    assert written_by_a_cache(path) is written
    assert cache_root_of(path) == root
