"""Fires lint-threaded-model-call: two data-parallel pairs stepped on a thread pool (each pair's
forward and backward enter the same autotuned kernels), and a Triton kernel launched from a thread."""

from concurrent.futures import ThreadPoolExecutor
from threading import Thread

import triton
import triton.language as tl


@triton.jit
def add_kernel(x, y, out, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out + offsets, tl.load(x + offsets) + tl.load(y + offsets), mask=offsets < n)


def train(pairs, batches):
    def pair_step(pair, batch):
        loss = pair.model(batch).sum()
        loss.backward()
        return loss.item()

    with ThreadPoolExecutor(max_workers=len(pairs)) as pool:
        for batch in batches:
            list(pool.map(pair_step, pairs, [batch] * len(pairs)))  # POOL_STEP


class Adder:
    def launch(self, x, y, out):
        add_kernel[(triton.cdiv(x.numel(), 256),)](x, y, out, x.numel(), BLOCK=256)

    def start(self, x, y, out):
        worker = Thread(target=self.launch, args=(x, y, out))  # THREAD_KERNEL
        worker.start()
        return worker
