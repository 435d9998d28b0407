"""The failure a test shows: a headline, then each finding as the terminal report prints it."""

from __future__ import annotations

import textwrap

from dflashdoctor.report import Finding
from dflashdoctor.safe_text import encodable, without_controls

_WIDTH = 100


def message(headline: str, findings: list[Finding]) -> str:
    """Made safe for a terminal: a path may hold escape sequences or bytes that are not UTF-8."""
    lines = [headline]
    for f in findings:
        lines += ["", f"[{f.severity}] {f.code}  {f.title}"]
        if f.where:
            module = f" ({f.where.module})" if f.where.module else ""
            lines.append(f"    at {f.where.label()}{module}")
        for label, text in (("", f.detail), ("fix: ", f.fix)):
            if text:
                lines.append(textwrap.fill(label + text, _WIDTH, initial_indent="    ", subsequent_indent="    "))
    return without_controls(encodable("\n".join(lines)))
