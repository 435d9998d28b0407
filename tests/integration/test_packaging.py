"""The wheel carries every package and data file: `pip install dflashdoctor` alone must give a
working CLI, the agent's bootstrap and the probes included (a package missing from pyproject's list
works in a checkout and breaks only when installed)."""

from __future__ import annotations

import subprocess
import sys
import zipfile

from tests.paths import ROOT


def test_the_wheel_holds_every_package_and_the_bootstrap(tmp_path):
    build = [sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "--no-build-isolation", "-v"]
    built = subprocess.run([*build, "-w", str(tmp_path)], check=True, timeout=300, capture_output=True, text=True)
    said = built.stdout + built.stderr
    assert "Warning:" not in said and "SetuptoolsDeprecationWarning" not in said, said[-3000:]
    (wheel,) = tmp_path.glob("dflashdoctor-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    metadata = next(zipfile.Path(wheel, name).read_text() for name in names if name.endswith(".dist-info/METADATA"))
    assert "License-Expression: Apache-2.0" in metadata and "License-File: LICENSE" in metadata
    assert "Classifier: Topic :: Software Development :: Debuggers" in metadata
    assert any(name.endswith(".dist-info/licenses/LICENSE") for name in names)
    packages = {p.parent.relative_to(ROOT).as_posix() for p in (ROOT / "dflashdoctor").rglob("__init__.py")}
    missing = sorted(p for p in packages if f"{p}/__init__.py" not in names)
    assert not missing, f"packages not in the wheel: {missing}"
    probes = {f"dflashdoctor/probes/{p.name}" for p in (ROOT / "probes").glob("*.py")}
    assert probes <= names
    assert "dflashdoctor/agent/bootstrap/sitecustomize.py" in names


def test_help_is_plain_text_with_h_and_run_says_its_usage_once():
    def helped(*args: str) -> str:
        done = subprocess.run([sys.executable, "-m", "dflashdoctor", *args, "-h"], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        return done.stdout

    assert "[tool.dflashdoctor]" in helped("init")  # a TOML table, not rich markup to drop
    assert "[tool.dflashdoctor.lint]" in helped("lint")
    run = helped("run")
    assert run.count("Usage:") == 1 and "run [OPTIONS] -- COMMAND ARGS..." in run
    assert "--install-completion" in helped()
