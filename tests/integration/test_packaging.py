"""The wheel carries every package and data file: `pip install dflashdoctor` alone must give a
working CLI, the agent's bootstrap and the probes included (a package missing from pyproject's list
works in a checkout and breaks only when installed)."""

from __future__ import annotations

import subprocess
import sys
import zipfile

from tests.paths import ROOT


def test_the_wheel_holds_every_package_and_the_bootstrap(tmp_path):
    build = [sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "--no-build-isolation", "-q"]
    subprocess.run([*build, "-w", str(tmp_path)], check=True, timeout=300)
    (wheel,) = tmp_path.glob("dflashdoctor-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    packages = {p.parent.relative_to(ROOT).as_posix() for p in (ROOT / "dflashdoctor").rglob("__init__.py")}
    missing = sorted(p for p in packages if f"{p}/__init__.py" not in names)
    assert not missing, f"packages not in the wheel: {missing}"
    probes = {f"dflashdoctor/probes/{p.name}" for p in (ROOT / "probes").glob("*.py")}
    assert probes <= names
    assert "dflashdoctor/agent/bootstrap/sitecustomize.py" in names
