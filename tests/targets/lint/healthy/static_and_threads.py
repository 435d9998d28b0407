"""The healthy twins of static_varying.py and threaded_step.py: a dynamic=False wrapper called with
one fixed length; a wrapper without dynamic=False called with lengths that vary; a loop that passes
batches on untouched; pairs on threads that hold one lock around the step; threads that do no step."""

import threading
from concurrent.futures import ThreadPoolExecutor

import torch
from torch.nn.attention.flex_attention import flex_attention

SEQUENCE = 512
static_flex = torch.compile(flex_attention, dynamic=False)
dynamic_flex = torch.compile(flex_attention)


def fixed_lengths(steps):
    for _ in range(steps):
        q = torch.randn(1, 4, SEQUENCE, 16)
        static_flex(q, q, q)


def varying_lengths(lengths):
    for length in lengths:
        q = torch.randn(1, 4, length, 16)
        dynamic_flex(q, q, q)


def passed_on(batches):
    for batch in batches:
        static_flex(batch, batch, batch)


def locked_pairs(pairs, batch):
    one_at_a_time = threading.Lock()

    def pair_step(pair):
        with one_at_a_time:
            pair.model(batch).sum().backward()

    with ThreadPoolExecutor(max_workers=len(pairs)) as pool:
        list(pool.map(pair_step, pairs))


def load_in_background(paths, load):
    with ThreadPoolExecutor() as pool:
        return list(pool.map(load, paths))
