"""The README documents every finding code and every exit code the tool can produce."""

from __future__ import annotations

from pathlib import Path

from dflashdoctor.codes import CODES

README = Path(__file__).parent.parent / "README.md"


def test_every_finding_code_is_documented():
    text = README.read_text()
    missing = [code for code in CODES if f"`{code}`" not in text]
    assert missing == []


def test_exit_codes_are_documented():
    text = README.read_text()
    for line in ("| 0 |", "| 1 |", "| 2 |", "| 3 |"):
        assert line in text
