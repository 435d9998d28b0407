"""A source file's `ast`, read as Python reads the file it runs, with every refusal a SyntaxError:
`lint` and `init` list such a file as one they cannot parse and go on.

The bytes are decoded by `importlib.util.decode_source`, the standard library's reading of a source
file: a UTF-8 byte-order mark, else a PEP 263 coding cookie in the first two lines
(`# -*- coding: latin-1 -*-`), else UTF-8, the whole file, strictly. Decoding as UTF-8 alone kept
the mark (an invalid character to the parser: the file was skipped and its calls never seen) and
refused every file written in another declared encoding. Handing the bytes to `ast.parse` instead
would be laxer than `python file.py`, which refuses a file whose comment holds a byte that is not
UTF-8: compiling bytes does not look at comments.
"""

from __future__ import annotations

import ast
from importlib.util import decode_source


def parse_source(path: str, source: str | bytes) -> ast.Module:
    """The tree of `source` (bytes: the file as read). A coding cookie that names no codec, or one
    that disagrees with a byte-order mark, is a SyntaxError from the decoder itself; bytes that the
    declared codec cannot decode (UnicodeDecodeError), and a cookie naming a codec that does not
    decode to text (`hex`: LookupError), are made one. A NUL byte is a SyntaxError from the parser
    (a ValueError on older releases, which the callers also catch). CPython's parser raises
    MemoryError, not a SyntaxError, for an expression nested past its own stack (`x = ` and a
    million `-`, 300,000 `not `, 50,000 `lambda:`, each well under lint's 4 MiB cap): the file's
    fault, said as a SyntaxError like any other refusal. (RecursionError, which a deep tree can
    raise here or in a walk of it, the callers catch.)"""
    if isinstance(source, bytes):
        try:
            source = decode_source(source)
        except (UnicodeError, LookupError) as exc:
            raise SyntaxError(f"{path} cannot be decoded as Python source: {exc}") from None
    try:
        return ast.parse(source, filename=path)
    except MemoryError:
        raise SyntaxError(f"{path} nests too deeply for Python's parser") from None
