"""The type checker holds the types: mypy over the package and the probe scripts, configured in
pyproject.toml (strict on the records, the observations, the probe registry, the judges and the
gate). Run inside the suite, so that the README's one test command checks them as CI does."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_the_type_checker_passes() -> None:
    try:
        import mypy  # noqa: F401  # the dev extra installs it
    except ImportError:
        pytest.fail("mypy is not installed: install the dev extra (`pip install -e '.[dev]'`)")
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--no-error-summary"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, f"mypy found type errors:\n{done.stdout}{done.stderr}"
