"""`versions` as users run it: this interpreter's stack holds; a virtual environment over it that
seeds its own setuptools (older than torch requires) is named, with both versions and the fix."""

from __future__ import annotations

import subprocess
import sys
from importlib import metadata

from packaging.requirements import Requirement


def test_this_stack_is_listed_and_each_requirement_checked(cli):
    run = cli("versions")
    assert run.code == 0, run.stdout + run.stderr
    (section,) = run.report["results"]
    assert section["measurements"]["packages"]["torch"] == metadata.version("torch")
    assert section["checks"][0]["name"] == "requirements"


def test_a_venvs_own_setuptools_below_torchs_requirement_is_named(cli, tmp_path):
    """Ground truth from the metadata, independently: torch's setuptools requirement against the
    setuptools the new environment seeded."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    seeded = subprocess.run(
        [python, "-c", "from importlib import metadata; print(metadata.version('setuptools'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    wanted = next(Requirement(r) for r in metadata.requires("torch") or [] if r.startswith("setuptools"))
    run = cli("versions", "--python", python)
    assert run.code == 0, run.stdout + run.stderr
    unmet = {f["evidence"]["name"]: f for f in run.findings("requirement-unmet")}
    if wanted.specifier.contains(seeded):
        assert "setuptools" not in unmet  # this Python seeds one torch accepts
        return
    finding = unmet["setuptools"]
    assert finding["title"] == f"torch {metadata.version('torch')} requires {wanted}, but {seeded} is installed"
    assert finding["fix"].startswith(f"pip install '{wanted}'")
