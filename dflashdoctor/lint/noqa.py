"""`# noqa` on a line silences lint's findings there, as it does ruff's and flake8's: bare, every
code; `# noqa: DFD001, DFD003` (or the long codes), those. Codes of other tools on the same comment
(`# noqa: E501, DFD001`) are theirs and ignored here."""

from __future__ import annotations

import re

from dflashdoctor.lint.settings import RULE_CODES, SHORT_CODES

_NOQA = re.compile(r"#\s*noqa(?::\s*(?P<codes>[\w\-]+(?:[\s,]+[\w\-]+)*))?", re.IGNORECASE)


def directives(text: str) -> dict[int, frozenset[str] | None]:
    """Line -> the long codes its `# noqa` names (None: bare, every code). Only lines that hold
    `noqa` are matched, so a large file costs one search."""
    found: dict[int, frozenset[str] | None] = {}
    if "noqa" not in text.lower():
        return found
    for number, line in enumerate(text.splitlines(), 1):
        if "#" not in line:
            continue
        match = _NOQA.search(line)
        if match is None:
            continue
        words = re.split(r"[\s,]+", match.group("codes") or "")
        codes = {RULE_CODES.get(w.upper(), w) for w in words if w}
        found[number] = None if not match.group("codes") else frozenset(c for c in codes if c in SHORT_CODES)
    return found


# A raw call's two codes are one call: `# noqa: DFD001` on it silences whichever it is judged.
_SAME_CALL = {"lint-raw-flex-call-on-purpose": "lint-raw-flex-call"}


def silenced(code: str, line: int | None, noqa: dict[int, frozenset[str] | None]) -> bool:
    if line is None or line not in noqa:
        return False
    codes = noqa[line]
    return codes is None or code in codes or _SAME_CALL.get(code) in codes
