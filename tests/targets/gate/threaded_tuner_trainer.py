"""A trainer whose two data-parallel pairs run on threads and both launch one real triton autotuned
kernel (triton's interpreter: TRITON_INTERPRET=1, no GPU), then one optimizer step. The first
step's autotuning is cold: the first pair is held inside a benchmark until the second has entered
the same autotuner, as an unlucky schedule would. `--lock` holds the pairs to one launch at a time
(the fix), so no second thread ever enters while the first is inside."""

import sys
import threading

import torch

from dflashdoctor.autotune.stub_kernel import autotuned_add, launch

locked = "--lock" in sys.argv
inside, second_entered = threading.Event(), threading.Event()


def bench_hook() -> None:
    if threading.current_thread().name == "pair-0" and not locked:
        inside.set()
        second_entered.wait(5)


tuner = autotuned_add(bench_hook)
one_at_a_time = threading.Lock()
model = torch.nn.Linear(4, 4)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)


def pair(index: int) -> None:
    if index == 1 and not locked:
        inside.wait(5)
        second_entered.set()
    if locked:
        with one_at_a_time:
            launch(tuner, index)  # LOCKED_LAUNCH
    else:
        launch(tuner, index)  # LAUNCH_LINE


for _step in range(3):
    pairs = [threading.Thread(target=pair, args=(i,), name=f"pair-{i}") for i in range(2)]
    for thread in pairs:
        thread.start()
    for thread in pairs:
        thread.join()
    model(torch.randn(2, 4)).sum().backward()
    optimizer.step()
    optimizer.zero_grad()
