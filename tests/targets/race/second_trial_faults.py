"""Race TARGETs whose trial host fails in the second trial it runs, over the stub kernel's shared
autotuner otherwise: `killed` ends the process with SIGKILL (as the OOM killer or a segfault would),
`hangs` never returns. A trial calls the target once per thread and once more per thread to compare
outputs, so with two threads the fifth call in a process is the second trial's first."""

from __future__ import annotations

import os
import signal
import threading
import time

import torch

from dflashdoctor.autotune.stub_kernel import shared_add

CALLS_PER_TRIAL = 4  # two threads, each call repeated alone
_calls = 0
_count = threading.Lock()


def _in_second_trial() -> bool:
    global _calls
    with _count:
        _calls += 1
        return _calls == CALLS_PER_TRIAL + 1


def killed(worker: int, device: str) -> torch.Tensor:
    if _in_second_trial():
        os.kill(os.getpid(), signal.SIGKILL)
    return shared_add(worker, device)


def hangs(worker: int, device: str) -> torch.Tensor:
    if _in_second_trial():
        while True:
            time.sleep(1)
    return shared_add(worker, device)
