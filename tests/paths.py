"""Where the tests' own files are, wherever a test module sits."""

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent  # the repository
TARGETS = ROOT / "tests" / "targets"  # user code the commands are pointed at
