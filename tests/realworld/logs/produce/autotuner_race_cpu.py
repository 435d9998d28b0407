"""Two data-parallel pairs on threads sharing one real Triton autotuner (triton's interpreter:
TRITON_INTERPRET=1, no GPU; a fresh TRITON_CACHE_DIR so the tune is cold), on the schedule that
crashes: the first pair is inside the autotuner's benchmark while the second runs the same
`Autotuner.run` to its end, which sets the shared `nargs` to None under the first. Produces
`36_produced_cpu_thread_autotuner_race.log` (stdout and stderr)."""

import threading

import torch

from dflashdoctor.autotune.stub_kernel import autotuned_add, launch

first_inside, second_done = threading.Event(), threading.Event()


def hold_the_first_pair() -> None:
    """The benchmark hook: an unlucky scheduler, made certain."""
    if threading.current_thread().name == "pair-0" and not first_inside.is_set():
        first_inside.set()
        second_done.wait(10)


tuner = autotuned_add(hold_the_first_pair)
model = torch.nn.Linear(4, 4)


def pair(index: int) -> None:
    if index == 1:
        first_inside.wait(10)
    try:
        out = launch(tuner, index)
    finally:
        if index == 1:
            second_done.set()
    model(out[:4]).sum().backward()


pairs = [threading.Thread(target=pair, args=(i,), name=f"pair-{i}") for i in range(2)]
for thread in pairs:
    thread.start()
for thread in pairs:
    thread.join()
