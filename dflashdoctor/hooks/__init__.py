"""Instrumentation installed inside the probed process (standard library, torch, triton, transformers).

`AutotunerGuard` is also a library API for trainers: it records two threads inside one triton
autotuner and can serialize them (see autotuner_guard.py). It imports triton only when entered.
"""

from dflashdoctor.hooks.autotuner_guard import AutotunerGuard, ConcurrentEntry

__all__ = ["AutotunerGuard", "ConcurrentEntry"]
