"""The dense-path hook in this process: it sees eager flex_attention, not Inductor's, and restores."""

from __future__ import annotations

import sys

import pytest
import torch
from torch._C import DispatchKey
from torch.nn.attention.flex_attention import flex_attention

from dflashdoctor.hooks.flex_dense import DenseFlexRecorder

pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def _inputs():
    q = torch.randn(1, 4, 128, 16)
    kv = torch.randn(1, 1, 256, 16)
    return q, kv, kv.clone()


def _kernels():
    module = sys.modules["torch._higher_order_ops.flex_attention"]
    key = DispatchKey.CompositeExplicitAutograd
    return [module.flex_attention.py_kernels[key], module.flex_attention_backward.py_kernels[key]]


def test_eager_call_is_recorded_with_this_call_site():
    q, k, v = _inputs()
    with DenseFlexRecorder() as recorder:
        recorder.phase = "eager"
        flex_attention(q, k, v, enable_gqa=True)
    assert recorder.unavailable is None
    (event,) = recorder.events
    assert (event.kind, event.phase, event.q_shape, event.kv_shape) == (
        "forward",
        "eager",
        [1, 4, 128, 16],
        [1, 1, 256, 16],
    )
    assert event.score_matrix_bytes == 1 * 4 * 128 * 256 * 4
    assert event.site["file"] == __file__
    assert event.site["function"] == "test_eager_call_is_recorded_with_this_call_site"


def test_inductor_call_is_not_recorded():
    q, k, v = _inputs()
    compiled = torch.compile(flex_attention)
    with DenseFlexRecorder() as recorder:
        out = compiled(q, k, v, enable_gqa=True)
    assert recorder.events == []
    expected = flex_attention(q.double(), k.double(), v.double(), enable_gqa=True)
    assert torch.allclose(out.double(), expected, atol=1e-4)


def test_hook_restores_the_original_kernels():
    before = _kernels()
    with DenseFlexRecorder():
        assert _kernels() != before
    assert _kernels() == before
    q, k, v = _inputs()
    recorder = DenseFlexRecorder()
    flex_attention(q, k, v, enable_gqa=True)
    assert recorder.events == []
