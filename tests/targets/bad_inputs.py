"""Attributes that are wrong as check-compile targets, each in its own way."""

import os
import signal
import time

NOT_CALLABLE = 42


def wrong_signature(query, key):
    return query


def raises(query, key, value, block_mask=None, enable_gqa=False):
    raise RuntimeError("attention backend not initialised")


def raises_hostile(query, key, value, block_mask=None, enable_gqa=False):
    """A message with an escape sequence, a bell, a NUL, markup, backticks and a lone surrogate."""
    raise RuntimeError("\x1b[31mred\x07 \x00 <script>alert(1)</script> `tick` bad \udcff name")


def killed_by_signal(query, key, value, block_mask=None, enable_gqa=False):
    os.kill(os.getpid(), signal.SIGKILL)


def hangs(query, key, value, block_mask=None, enable_gqa=False):
    while True:
        time.sleep(1)
