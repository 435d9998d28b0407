"""Strings made safe for each output, in one place.

A report carries strings that targets and filesystems produce: exception messages, paths, argv. Any
of them may hold a lone surrogate (a file name that is not UTF-8, which Python decodes with
surrogateescape), control characters (escape sequences that would drive the terminal, bytes that
XML forbids) or markup. Every output first makes the whole report encodable (`encodable_report`),
then each renderer applies its own rule: the terminal and GitHub's log (`without_controls`), XML and
HTML (`xml_legal`), Markdown (`markdown_text`, `markdown_code`). Nothing is dropped: each character
that cannot stand becomes a visible escape (`\\xe9`, `\\x1b`), as `ls -b` shows file names.
"""

from __future__ import annotations

import html
import re
from collections.abc import Callable
from typing import Any

from dflashdoctor.report import Report

# C0 controls but tab and newline, DEL, and the C1 controls (some terminals act on 0x9b as ESC [)
_CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")
# what XML 1.0 forbids: C0 controls but tab, newline and carriage return; U+FFFE, U+FFFF
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")
_BACKTICKS = re.compile("`+")
_SURROGATES = re.compile("[\ud800-\udfff]")


def _escaped(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def _surrogate(match: re.Match[str]) -> str:
    code = ord(match.group())
    if 0xDC80 <= code <= 0xDCFF:  # a byte Python could not decode, kept by surrogateescape
        return f"\\x{code - 0xDC00:02x}"
    return f"\\u{code:04x}"


def encodable(text: str) -> str:
    """`text` as valid UTF-8 can carry it: undecodable file-name bytes as `\\xNN`, other lone
    surrogates as `\\udNNN`."""
    return _SURROGATES.sub(_surrogate, text)


def without_controls(text: str) -> str:
    """For a terminal or a CI log: no character that a terminal would act on."""
    return _CONTROLS.sub(_escaped, text)


def xml_legal(text: str) -> str:
    """For XML and HTML text and attributes (which the renderers escape for markup themselves)."""
    return _NOT_XML.sub(_escaped, text)


def markdown_text(text: str) -> str:
    """Plain Markdown text: no HTML a viewer would render, no controls."""
    return html.escape(without_controls(text), quote=False)


def markdown_code(text: str) -> str:
    """An inline code span that `text` cannot close: a fence longer than any run of backticks in it."""
    text = without_controls(text).replace("\n", " ")
    fence = "`" * (max((len(m) for m in _BACKTICKS.findall(text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def markdown_block_fence(text: str) -> str:
    """A fence for a code block that `text` cannot close."""
    return "`" * max(3, max((len(m) for m in _BACKTICKS.findall(text)), default=0) + 1)


def _mapped(value: Any, change: Callable[[str], str]) -> Any:
    """Strings changed, containers walked, numbers kept, anything else (a Path in evidence) as its text."""
    if isinstance(value, str):
        return change(value)
    if isinstance(value, dict):
        return {_mapped(k, change): _mapped(v, change) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_mapped(v, change) for v in value]
    if value is None or isinstance(value, bool | int | float):
        return value
    return change(str(value))


def with_strings(report: Report, change: Callable[[str], str]) -> Report:
    """A copy of the report with `change` applied to every string in it, keys included."""
    return Report.from_dict(_mapped(report.to_dict(), change))


def encodable_report(report: Report) -> Report:
    return with_strings(report, encodable)
