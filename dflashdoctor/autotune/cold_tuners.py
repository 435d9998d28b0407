"""Every live triton autotuner made cold again, so that trials can share one interpreter.

A trial tests the race only if it tunes cold. Importing FLA's ops takes about 10 s, so a process per
trial spends most of each trial importing; a trial host imports once and, before each trial, empties
what an autotuner remembers of earlier calls. That state is `Autotuner.cache` (tuning key -> chosen
config: a key found there is never benchmarked again); `configs_timings` is set only by a benchmark,
so clearing it marks which tuners benchmarked in the next trial. Results on disk are off for the
whole series (`TRITON_CACHE_AUTOTUNING=0`, `FLA_CACHE_RESULTS=0`, `FLA_CACHE_MODE=disabled`) and
checked after each trial by the host. Tuners are found by the garbage collector, not by module: a
workload may keep its tuners anywhere (FLA's are module globals, a TARGET's may sit in a closure).
"""

from __future__ import annotations

import gc
from typing import Any

from dflashdoctor.hooks.autotuner_guard import kernel_name


def live_tuners() -> list[Any]:
    """Every triton Autotuner (or subclass, like FLA's CachedAutotuner) alive in this process."""
    try:
        from triton.runtime.autotuner import Autotuner
    except ImportError:  # the workload runs no triton: nothing to make cold
        return []
    # type(), not isinstance(): the latter reads __class__, which some of torch's deprecated aliases warn on
    return [obj for obj in gc.get_objects() if issubclass(type(obj), Autotuner)]


def make_cold(tuners: list[Any]) -> int:
    """Empty every tuner's tuning cache; the number of results cleared (zero before the first trial,
    the previous trial's keys before each later one)."""
    cleared = 0
    for tuner in tuners:
        cache = getattr(tuner, "cache", None)
        if isinstance(cache, dict):
            cleared += len(cache)
            cache.clear()
        tuner.configs_timings = None
    return cleared


def benchmarked(tuners: list[Any]) -> dict[str, int]:
    """The tuners that benchmarked since `make_cold`, with the number of tuning keys each holds."""
    tuned: dict[str, int] = {}
    for tuner in tuners:
        if getattr(tuner, "configs_timings", None) is not None:
            name = kernel_name(tuner)
            tuned[name] = tuned.get(name, 0) + len(getattr(tuner, "cache", {}) or {})
    return dict(sorted(tuned.items()))


def entered_warm(entered: list[str], tuners: list[Any], tuned: dict[str, int]) -> list[str]:
    """Kernels a trial called that have configs to choose from yet benchmarked none of them: their
    choice came from somewhere other than this trial's tuning, so the trial was not cold for them."""
    choices = {kernel_name(t): len(getattr(t, "configs", []) or []) for t in tuners}
    return [name for name in entered if choices.get(name, 0) > 1 and name not in tuned]
