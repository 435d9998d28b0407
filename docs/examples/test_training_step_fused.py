"""A training-step test: forward and backward of a DFlash drafter must both stay fused.

    python3 -m pytest docs/examples/test_training_step_fused.py      # on a CUDA machine

flex_attention has no backward on the CPU, so the step needs a GPU. The drafter here is
dflashdoctor's reference one (five layers at the qwen27b-dflash size, bf16); put your own model and
batch in its place. `expect_fused()` fails the test when any layer's forward or backward runs the
dense kernel, and the block's recording is there to assert on as well.
"""

import pytest
import torch

from dflashdoctor.models import build_config
from dflashdoctor.reference.drafter_step import make_drafter_step
from dflashdoctor.testing import expect_fused


@pytest.mark.skipif(not torch.cuda.is_available(), reason="flex_attention's backward needs CUDA")
def test_drafter_training_step_is_fused() -> None:
    config = build_config("qwen27b-dflash", "full")
    # 256 draft tokens over 4096 of context (at 64 over 256, torch 2.11's Inductor has no
    # flex_attention config for this head size on an H200 and fails to compile)
    _drafter, step = make_drafter_step(config, "cuda", torch.bfloat16, None, backward=True, blocks=16, context_len=4096)
    with expect_fused() as seen:
        step()  # forward, loss, backward
    assert seen.dense_events == []
