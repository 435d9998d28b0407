"""Two threads, one process-global flag: while one thread is inside torch.fx tracing (here held
open on an event, as a long compile holds it), another thread's call into a torch.compile'd function
sees torch's FX-tracing flag set and raises RuntimeError("Detected that you are using FX to
symbolically trace a dynamo-optimized function")."""

import threading

import torch

tracing = threading.Event()
release = threading.Event()


class SlowToTrace(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tracing.set()
        release.wait(timeout=60)
        return x * 2


def trace_in_a_thread() -> None:
    torch.fx.symbolic_trace(SlowToTrace())


@torch.compile(backend="eager")
def step(x: torch.Tensor) -> torch.Tensor:
    return x + 1


tracer = threading.Thread(target=trace_in_a_thread, name="tracer")
tracer.start()
tracing.wait(timeout=60)
try:
    step(torch.ones(4))  # CALL_LINE
finally:
    release.set()
    tracer.join()
