"""Which threads' dense calls a block (record(), expect_fused()) is charged with: its own thread's,
the threads it starts, an idle pool worker's job taken from it; not the work of a thread an earlier
test left running in its loop. Real flex_attention, dense on the CPU (called outside torch.compile;
flex has no CPU backward: tests/integration/test_gpu_expect_fused.py has the backward on the
autograd engine's thread); the truth is the calls each thread made, counted by the thread."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from torch.nn.attention.flex_attention import flex_attention

from dflashdoctor.testing import record

pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def _dense_call() -> None:
    q = torch.randn(1, 2, 32, 16)
    flex_attention(q, q, q)


class _LeftRunning:
    """An earlier test's thread that keeps calling flex_attention until told to stop."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.calls = 0
        self.thread = threading.Thread(target=self._loop, name="left-by-an-earlier-test")

    def _loop(self) -> None:
        while not self.stop.is_set():
            _dense_call()
            self.calls += 1

    def __enter__(self) -> _LeftRunning:
        self.thread.start()
        while self.calls < 2 and self.thread.is_alive():  # it is in its loop before the block opens
            time.sleep(0.01)
        assert self.thread.is_alive()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()


def test_a_thread_an_earlier_test_left_running_is_not_charged_to_the_block():
    with _LeftRunning() as left:
        before = left.calls
        with record() as seen:
            while left.calls < before + 3:  # its dense calls run during the block
                time.sleep(0.01)
            _dense_call()  # the block's own
    assert [(e.kind, e.thread) for e in seen.dense_events] == [("forward", "MainThread")]


def test_the_blocks_own_threads_and_an_idle_pool_workers_job_are_charged_to_it():
    pool = ThreadPoolExecutor(1, thread_name_prefix="made-before")
    pool.submit(lambda: None).result()  # its worker exists, idle, when the block opens
    try:
        with record() as seen:
            pool.submit(_dense_call).result()
            started = threading.Thread(target=_dense_call, name="started-in-block")
            started.start()
            started.join()
    finally:
        pool.shutdown()
    assert [e.thread for e in seen.dense_events] == ["made-before_0", "started-in-block"]


def test_a_pool_worker_busy_with_an_earlier_job_is_charged_only_with_the_blocks_job():
    release = threading.Event()
    made = [0]

    def earlier_job() -> None:
        while not release.is_set():
            _dense_call()
            made[0] += 1

    pool = ThreadPoolExecutor(1)
    earlier = pool.submit(earlier_job)
    time.sleep(0.2)
    try:
        with record() as seen:
            at_open = made[0]
            later = pool.submit(_dense_call)  # queued behind the earlier job
            time.sleep(0.2)
            release.set()
            earlier.result()
            later.result()
    finally:
        pool.shutdown()
    assert made[0] > at_open  # the earlier job made dense calls while the block was open
    assert len(seen.dense_events) == 1  # they are not the block's: only the job it submitted is


@pytest.mark.gpu
def test_on_a_gpu_the_left_threads_backward_on_the_autograd_thread_is_not_the_blocks():
    """On CUDA the dense backward runs on the autograd engine's device thread, shared by every
    thread: each backward is charged through its forward, so the left thread's stay its own."""
    stop = threading.Event()
    calls = [0]

    def forward_backward() -> None:
        q = torch.randn(1, 2, 128, 64, device="cuda", requires_grad=True)
        flex_attention(q, q, q).sum().backward()

    def loop() -> None:
        while not stop.is_set():
            forward_backward()
            calls[0] += 1

    left = threading.Thread(target=loop, name="left-by-an-earlier-test")
    left.start()
    try:
        while calls[0] < 2 and left.is_alive():
            time.sleep(0.01)
        with record() as seen:
            at_open = calls[0]
            while calls[0] < at_open + 3 and left.is_alive():
                time.sleep(0.01)
            forward_backward()
    finally:
        stop.set()
        left.join()
    assert calls[0] >= at_open + 3
    assert [e.kind for e in seen.dense_events] == ["forward", "backward"]
    assert seen.dense_events[0].thread == "MainThread"
