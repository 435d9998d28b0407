"""Peak memory of one phase of a probe, from the CUDA caching allocator.

The allocator's peak since a reset, minus what was allocated when the phase began, is exact for
tensors. On the CPU there is no such counter: the process RSS moves with allocator caching and
page reuse (a dense call after a fused one can show 0 bytes), so CPU phases report None rather
than a number that misleads.
"""

from __future__ import annotations


class PeakMemory:
    """`start()` before a phase, `stop()` after it: bytes the phase added at its peak, or None."""

    def __init__(self, device: str) -> None:
        self.device = device
        self._base: int | None = None

    def start(self) -> None:
        if self.device != "cuda":
            return
        import torch

        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        self._base = torch.cuda.memory_allocated()

    def stop(self) -> int | None:
        if self._base is None:
            return None
        import torch

        torch.cuda.synchronize()
        return max(0, torch.cuda.max_memory_allocated() - self._base)
