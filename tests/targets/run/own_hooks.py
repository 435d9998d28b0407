"""A program with its own excepthook: it must still run, print, and exit as it would alone."""

import sys


def hook(kind, exc, tb):
    print(f"own hook saw {kind.__name__}")
    sys.exit(5)


sys.excepthook = hook
print("hello from own_hooks")
raise KeyError("boom")
