"""TOML written from strings a repository supplies (file names, launch lines), so that no string can
become a key, end a comment early or leave the file unparseable.

`init` writes a file's name into a value (`target = "..."`) and into comments (`# ... at NAME:3`).
A name may hold a newline (`x\\nrun = "touch pwned"\\n#.py` becomes a `run` key in a comment written
raw), an escape sequence, or bytes that are not UTF-8 (which TOML, a UTF-8 format, cannot hold). So
a value is a basic string with every character TOML forbids there escaped, and a name that is not
text at all is no value; a comment is one line with every control character and undecodable byte
shown as a visible escape (`\\x1b`, `\\xff`), as the terminal shows them.
"""

from __future__ import annotations

import re

from dflashdoctor.safe_text import encodable

# What a TOML basic string may not hold raw: `"`, `\`, the C0 controls and DEL (tab is allowed, but
# escaped too so that the line reads the same everywhere).
_IN_STRING = re.compile('["\\\\\x00-\x1f\x7f]')
_SHORT = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}
# What a TOML comment may not hold: control characters other than tab (a newline ends it)
_IN_COMMENT = re.compile("[\x00-\x08\x0a-\x1f\x7f]")
_SURROGATE = re.compile("[\ud800-\udfff]")


class NotText(ValueError):
    """A string TOML cannot hold: it carries bytes that are not UTF-8 (a surrogate-escaped name)."""


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    return _SHORT.get(char) or f"\\u{ord(char):04X}"


def string(value: str) -> str:
    """`value` as a TOML basic string; NotText when it cannot be one."""
    if _SURROGATE.search(value):
        raise NotText(f"{encodable(value)} is not UTF-8 text")
    return f'"{_IN_STRING.sub(_escape, value)}"'


def value(item: object) -> str:
    """A value init writes: a string, a boolean or an integer."""
    if isinstance(item, bool):
        return "true" if item else "false"
    if isinstance(item, int):
        return str(item)
    if isinstance(item, str):
        return string(item)
    raise TypeError(f"init writes no {type(item).__name__}")


def comment(text: str) -> str:
    """`# text` on one line, whatever `text` holds."""
    shown = _IN_COMMENT.sub(lambda m: f"\\x{ord(m.group()):02x}", encodable(text))
    return f"# {shown}"
