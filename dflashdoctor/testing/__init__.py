"""dflashdoctor inside your own tests: assertions that fail the moment flex_attention runs dense, a
compiled wrapper falls back to eager, or two threads share a triton autotuner.

    from dflashdoctor.testing import expect_fused

    with expect_fused():
        loss = model(batch).sum()
        loss.backward()

`record()` gives the same events without raising. The pytest plugin (dflashdoctor.pytest_plugin)
applies these as markers (`@pytest.mark.flex_fused`) or to a whole run (`--flex-fused`).

Probed side: standard library and torch (triton for the autotuner check), as the hooks it reuses.
"""

from dflashdoctor.testing.expectations import (
    DenseAttentionError,
    ExpectationError,
    RecompileFallbackError,
    SharedAutotunerError,
    expect_fused,
    expect_no_recompile_fallback,
    expect_no_shared_autotuner,
)
from dflashdoctor.testing.recording import Recording, record

__all__ = [
    "DenseAttentionError",
    "ExpectationError",
    "RecompileFallbackError",
    "Recording",
    "SharedAutotunerError",
    "expect_fused",
    "expect_no_recompile_fallback",
    "expect_no_shared_autotuner",
    "record",
]
