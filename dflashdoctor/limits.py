"""The numbers a user gives (options, gate configuration): the range each may take, checked before any
probe runs. Anything outside is bad input, nan and infinity above all: they compare false with every
bound, so a timeout or a budget of nan would be silently switched off.

Standard library only: the gate's configuration and the CLI's options share these rules.
"""

from __future__ import annotations

import math

from dflashdoctor.shapes import MAX_SIZE

MAX_STEPS = 1_000_000  # training steps a trace or a run is asked for
MAX_VARY = 1_000  # check-compile's growing context lengths
MAX_TRIALS = 10_000  # race trials


MAX_SECONDS = 10**9  # about 32 years: a larger timeout or budget is a typo, and past 1e308 no float holds it


def _shown(value: object) -> str:
    """`value` as a message may quote it: an integer of hundreds of digits by its size (Python will
    not even write one past 4,300 digits as text)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        return f"a number of {value.bit_length()} bits"
    return repr(value)


def seconds_problem(value: object, name: str, *, zero_means: str | None = None) -> str | None:
    """Why `value` is not a usable number of seconds; 0 only where it means something (`zero_means`).
    `name` may be empty where the caller names the option itself."""
    subject = f"{name} " if name else ""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return f"{subject}must be a number of seconds, not {_shown(value)}"
    if isinstance(value, int) and value > MAX_SECONDS:  # before any float(): 10**400 has none
        return f"{subject}must be at most {MAX_SECONDS} seconds, not {_shown(value)}"
    if math.isnan(value) or math.isinf(value):
        off = f" (0 {zero_means})" if zero_means else ""
        return f"{subject}must be a finite number of seconds, not {value}{off}"
    if value < 0 or (value == 0 and not zero_means):
        return f"{subject}must be {'0 or more' if zero_means else 'above 0'} seconds, not {_shown(value)}"
    if value > MAX_SECONDS:
        return f"{subject}must be at most {MAX_SECONDS} seconds, not {value}"
    return None


def count_problem(value: object, name: str, low: int, high: int = MAX_SIZE) -> str | None:
    """Why `value` is not a whole number from `low` to `high`."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        return f"{name} must be a whole number from {low} to {high}, not {_shown(value)}"
    return None
