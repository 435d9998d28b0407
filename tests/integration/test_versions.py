"""`versions` as users run it: this interpreter's stack holds; a virtual environment over it that
seeds its own setuptools (older than torch requires) is named, with both versions and the fix; a
made distribution put first on the probed interpreter's path, whose metadata is not UTF-8 or whose
requirements hold what packaging cannot compare, is a finding or an unchecked line, never a crash."""

from __future__ import annotations

import os
import subprocess
import sys
from importlib import metadata

import pytest
from packaging.requirements import Requirement


def test_this_stack_is_listed_and_each_requirement_checked(cli_here):
    run = cli_here("versions")
    assert run.code == 0, run.stdout + run.stderr
    (section,) = run.report["results"]
    assert section["measurements"]["packages"]["torch"] == metadata.version("torch")
    assert section["checks"][0]["name"] == "requirements"


def test_a_venvs_own_setuptools_below_torchs_requirement_is_named(cli_here, tmp_path):
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
    run = cli_here("versions", "--python", python)
    assert run.code == 0, run.stdout + run.stderr
    unmet = {f["evidence"]["name"]: f for f in run.findings("requirement-unmet")}
    if wanted.specifier.contains(seeded):
        assert "setuptools" not in unmet  # this Python seeds one torch accepts
        return
    finding = unmet["setuptools"]
    assert finding["title"] == f"torch {metadata.version('torch')} requires {wanted}, but {seeded} is installed"
    assert finding["fix"].startswith(f"pip install '{wanted}'")


def _site_with(tmp_path, name: str, version: str, metadata_bytes: bytes) -> dict[str, str]:
    """The environment that puts a folder holding one distribution as pip installs it
    (NAME-VERSION.dist-info/METADATA) first on the probed interpreter's path: it stands in for the
    installed one of that name."""
    site = tmp_path / "site"
    (site / f"{name}-{version}.dist-info").mkdir(parents=True)
    (site / f"{name}-{version}.dist-info" / "METADATA").write_bytes(metadata_bytes)
    return {"PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))}


def _headers(name: str, version: bytes, *lines: bytes) -> bytes:
    return b"Metadata-Version: 2.1\nName: %s\nVersion: %s\n" % (name.encode(), version) + b"".join(lines)


def test_a_package_whose_metadata_is_not_utf8_is_named_not_a_crashed_probe(cli_here, tmp_path):
    """importlib.metadata raised UnicodeDecodeError from the probe: exit 3, probe-crashed. pip reads
    the same file, so the install is damaged: a finding that names it (and fla-core's requirement on
    it is left unchecked, not called unmet)."""
    env = _site_with(tmp_path, "einops", "0.8.2", _headers("einops", b"0.8.2", b"Summary: caf\xe9 \xff\n"))
    run = cli_here("versions", env=env)
    assert run.code == 0, run.stdout + run.stderr
    (found,) = run.findings("package-metadata-unreadable")
    assert found["title"].startswith("einops's installed metadata cannot be read: UnicodeDecodeError")
    assert "einops" not in run.report["results"][0]["measurements"]["packages"]
    assert "einops" not in {f["evidence"]["name"] for f in run.findings("requirement-unmet")}


@pytest.mark.parametrize(
    "lines",
    [
        [b"Requires-Dist: triton==" + b"9" * 5000 + b"\n"],  # past the 4,300 digits int() takes
        [b"Requires-Dist: torch; python_version > '" + b"9" * 5000 + b"'\n"],
        [b"Requires-Dist: tri\x00ton>=1\n", b"Requires-Dist: triton>=1\x00\n"],
    ],
    ids=["5000-digit-version", "5000-digit-marker", "nul"],
)
def test_a_requirement_packaging_cannot_compare_is_listed_unchecked(cli_here, tmp_path, lines):
    """A version of 5,000 digits made packaging raise ValueError in the probe (exit 3). Such a
    requirement is one pip could not compare either: it is listed, unchecked, as one packaging calls
    invalid always was; the rest of the stack is still checked."""
    env = _site_with(tmp_path, "kernels", "0.19.1", _headers("kernels", b"0.19.1", *lines))
    run = cli_here("versions", env=env)
    assert run.code == 0 and "Traceback" not in run.stderr, run.stdout + run.stderr
    (section,) = run.report["results"]
    kernels = next(row for row in section["tables"][0]["rows"] if row[0] == "kernels")
    assert kernels[1] == "0.19.1" and "(unmet)" not in kernels[2]
    requirements = next(c for c in section["checks"] if c["name"] == "requirements")
    assert f"; {len(lines)} could not be checked" in requirements["summary"]
