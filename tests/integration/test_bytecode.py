"""`env`'s bytecode check on real packages: a copy of the installed transformers with no bytecode,
found first on the probed interpreter's path, under PYTHONDONTWRITEBYTECODE=1 as container images set
it; the finding's own fix command run as written; bytecode made stale by editing a source file."""

from __future__ import annotations

import os
import py_compile
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dflashdoctor.bytecode import package_bytecode
from tests.conftest import permissions_apply, run_cli

transformers = pytest.importorskip("transformers")


@pytest.fixture
def transformers_without_bytecode(tmp_path: Path) -> Path:
    """The installed transformers' sources, copied without any `__pycache__`."""
    copy = tmp_path / "site" / "transformers"
    shutil.copytree(Path(transformers.__file__).parent, copy, ignore=shutil.ignore_patterns("__pycache__"))
    return copy


def _bytecode_check(run) -> dict:
    (env,) = run.report["results"]
    (check,) = [c for c in env["checks"] if c["name"] == "bytecode"]
    return check


def test_env_reports_packages_with_no_bytecode_that_none_will_write_and_its_fix_works(
    tmp_path, transformers_without_bytecode
):
    site = transformers_without_bytecode.parent
    env = {"PYTHONPATH": str(site), "PYTHONDONTWRITEBYTECODE": "1"}
    run = run_cli(tmp_path, "env", env=env)
    assert run.code == 0, run.stderr
    (found,) = run.findings("bytecode-not-cached")
    assert found["severity"] == "warning"
    assert found["title"].startswith("transformers: no compiled bytecode")
    assert "PYTHONDONTWRITEBYTECODE is set" in found["title"]
    (package,) = found["evidence"]["packages"]
    assert package["path"] == str(transformers_without_bytecode)
    assert package["cached"] == 0 and package["modules"] > 1000 and package["writable"] is False
    assert found["evidence"]["dont_write_bytecode"] is True
    assert _bytecode_check(run)["status"] == "warn"
    assert not list(transformers_without_bytecode.rglob("*.pyc"))  # the probe itself wrote nothing there

    fix = found["fix"].split(": ", 1)[1].split(". Python reads")[0]
    subprocess.run(["bash", "-c", fix], check=True, env={**os.environ, **env})
    fixed = run_cli(tmp_path, "env", env=env)
    assert not fixed.findings("bytecode-not-cached")
    assert _bytecode_check(fixed)["status"] == "pass"


def test_a_writable_install_without_bytecode_is_no_finding(tmp_path, transformers_without_bytecode):
    # an empty PYTHONDONTWRITEBYTECODE is unset, for Python
    env = {"PYTHONPATH": str(transformers_without_bytecode.parent), "PYTHONDONTWRITEBYTECODE": ""}
    run = run_cli(tmp_path, "env", env=env)
    assert not run.findings("bytecode-not-cached")
    check = _bytecode_check(run)
    assert check["status"] == "info" and "the first import writes the rest" in check["summary"]


def test_a_read_only_install_without_bytecode_is_reported_as_such(tmp_path, transformers_without_bytecode):
    prefix = permissions_apply(tmp_path)
    folders = [transformers_without_bytecode, *(p for p in transformers_without_bytecode.rglob("*") if p.is_dir())]
    for folder in folders:
        folder.chmod(0o555)
    try:
        env = {"PYTHONPATH": str(transformers_without_bytecode.parent), "PYTHONDONTWRITEBYTECODE": ""}
        run = run_cli(tmp_path, "env", env=env, prefix=prefix)
    finally:
        for folder in folders:
            folder.chmod(0o755)
    (found,) = run.findings("bytecode-not-cached")
    assert "(their folders are not writable)" in found["title"]
    assert found["evidence"]["dont_write_bytecode"] is False
    assert not list(transformers_without_bytecode.rglob("*.pyc"))


def test_bytecode_made_before_its_source_changed_is_not_current(tmp_path, monkeypatch):
    package = tmp_path / "edited_pkg"
    package.mkdir()
    for name in ("__init__", "a", "b"):
        (package / f"{name}.py").write_text(f"NAME = {name!r}\n")
        py_compile.compile(str(package / f"{name}.py"), doraise=True)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert package_bytecode("edited_pkg") | {"path": ""} == {
        "package": "edited_pkg",
        "path": "",
        "modules": 3,
        "cached": 3,
        "writable": not sys.dont_write_bytecode,
    }
    later = time.time() + 10
    (package / "a.py").write_text("NAME = 'edited'\n")
    os.utime(package / "a.py", (later, later))
    assert package_bytecode("edited_pkg")["cached"] == 2
    assert package_bytecode("no_such_package_here") is None


def test_probes_keep_their_own_bytecode_where_the_install_has_none(tmp_path, monkeypatch):
    """An install without bytecode under PYTHONDONTWRITEBYTECODE=1: probes get a private bytecode
    cache (PYTHONPYCACHEPREFIX, 0700, this user's) and really write and reuse it there; the package's
    own folder stays as it was. Not over a prefix the user set, nor for another interpreter, nor into
    a folder others can write."""
    from dflashdoctor.runner import bytecode_env

    site = tmp_path / "site"
    (site / "bare_pkg").mkdir(parents=True)
    (site / "bare_pkg" / "__init__.py").write_text("VALUE = 7\n")
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("PYTHONPYCACHEPREFIX", raising=False)
    env = bytecode_env(sys.executable, ("bare_pkg",))
    prefix = Path(env["PYTHONPYCACHEPREFIX"])
    assert env["PYTHONDONTWRITEBYTECODE"] == "" and prefix == tmp_path / "cache" / "dflashdoctor" / "pycache"
    assert oct(prefix.stat().st_mode & 0o777) == "0o700"
    child_env = {**os.environ, **env, "PYTHONPATH": str(site)}
    subprocess.run([sys.executable, "-c", "import bare_pkg"], env=child_env, check=True)
    assert list(prefix.rglob("__init__*.pyc")) and not (site / "bare_pkg" / "__pycache__").exists()

    assert bytecode_env("/usr/bin/python3-other", ("bare_pkg",)) == {}  # another interpreter: not looked into
    monkeypatch.setenv("PYTHONPYCACHEPREFIX", str(tmp_path / "users-own"))
    assert bytecode_env(sys.executable, ("bare_pkg",)) == {}
    monkeypatch.delenv("PYTHONPYCACHEPREFIX")
    prefix.chmod(0o777)  # loosened by someone: not trusted with code that will be run
    assert bytecode_env(sys.executable, ("bare_pkg",)) == {}
    prefix.chmod(0o700)
    monkeypatch.delenv("PYTHONDONTWRITEBYTECODE")
    assert bytecode_env(sys.executable, ("bare_pkg",)) == {}  # bytecode is written as usual


def test_the_doctors_own_process_keeps_its_bytecode_where_the_install_has_none(tmp_path):
    """The same image, for the doctor's own command: a copy of dflashdoctor without bytecode under
    PYTHONDONTWRITEBYTECODE=1. Its console entry compiles into the private cache once and reads it
    from there after; the install stays untouched. A process that imports dflashdoctor as a library
    (a user's test with expect_fused) is left as it was, as is a user's own prefix."""
    site = tmp_path / "site"
    shutil.copytree(
        Path(__file__).resolve().parents[2] / "dflashdoctor",
        site / "dflashdoctor",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    cache = tmp_path / "cache"
    env = {**os.environ, "PYTHONPATH": str(site), "PYTHONDONTWRITEBYTECODE": "1", "XDG_CACHE_HOME": str(cache)}
    env.pop("PYTHONPYCACHEPREFIX", None)
    version = [sys.executable, "-m", "dflashdoctor", "--version"]
    run = {"env": env, "capture_output": True, "text": True, "check": True, "cwd": tmp_path}  # not this checkout's copy
    assert subprocess.run(version, **run).stdout.startswith("dflashdoctor")
    prefix = cache / "dflashdoctor" / "pycache"
    assert oct(prefix.stat().st_mode & 0o777) == "0o700"
    made = {p: p.stat().st_mtime_ns for p in prefix.rglob("cli.*.pyc")}
    assert len(made) == 1 and not list(site.rglob("__pycache__"))
    subprocess.run(version, **run)
    assert {p: p.stat().st_mtime_ns for p in prefix.rglob("cli.*.pyc")} == made  # read, not written again

    library = "import sys, dflashdoctor.cli; print(sys.pycache_prefix, sys.dont_write_bytecode)"
    shown = subprocess.run([sys.executable, "-c", library], **run)
    assert shown.stdout.split() == ["None", "True"]
    own = tmp_path / "users-own"
    subprocess.run(version, **{**run, "env": {**env, "PYTHONPYCACHEPREFIX": str(own)}})
    assert not list(own.rglob("*.pyc"))  # the user's prefix, the user's rule: nothing written there
    given = [sys.executable, "-X", f"pycache_prefix={own}", "-m", "dflashdoctor", "--version"]
    shutil.rmtree(prefix)
    subprocess.run(given, **run)  # a prefix given on the command line is the user's too
    assert not prefix.exists()


def test_the_private_cache_is_refused_where_another_user_could_put_code_in_it(tmp_path, monkeypatch):
    """Code is run from that cache, by root on a shared node too: a folder of the path that another
    user owns, a link planted in it, or a root others may rename folders out of is no private cache
    (the probes then compile from source as before); a sticky shared root such as /tmp is fine."""
    from dflashdoctor.bytecode import private_pycache

    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    monkeypatch.delenv("PYTHONPYCACHEPREFIX", raising=False)
    site = tmp_path / "site"
    (site / "bare_pkg").mkdir(parents=True)
    (site / "bare_pkg" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(site))

    def cache_under(root: Path):
        monkeypatch.setenv("XDG_CACHE_HOME", str(root))
        return private_pycache(("bare_pkg",))

    assert cache_under(tmp_path / "mine") == tmp_path / "mine" / "dflashdoctor" / "pycache"
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_under(Path("relative")) == tmp_path / "home" / ".cache" / "dflashdoctor" / "pycache"
    assert not list((tmp_path / "cwd").iterdir())  # nothing made in the folder the user stands in
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    assert cache_under(shared) is None  # others could rename our folder away and put theirs there
    shared.chmod(0o1777)
    assert cache_under(shared) == shared / "dflashdoctor" / "pycache"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "linked").mkdir()
    (tmp_path / "linked" / "dflashdoctor").symlink_to(elsewhere)
    assert cache_under(tmp_path / "linked") is None
    if os.geteuid() == 0:  # another user's folder on the path
        theirs = tmp_path / "theirs"
        (theirs / "dflashdoctor").mkdir(parents=True)
        os.chown(theirs / "dflashdoctor", 65534, 65534)
        assert cache_under(theirs) is None
