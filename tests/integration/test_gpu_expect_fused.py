"""On a GPU: `dflashdoctor.testing` over the reference drafter's real training step, forward and
backward, run by pytest as a user's suite runs it (pytester, a subprocess). The run's output is
kept in the evidence folder: reports/examples/h200-expect-fused/ holds the H200's."""

from __future__ import annotations

import pytest

from tests.integration.test_pytest_plugin import _run
from tests.paths import ROOT

pytest_plugins = ["pytester"]

_EAGER_WRAPPER = """
import pytest
import torch

from dflashdoctor.models import build_config
from dflashdoctor.reference.drafter_step import make_drafter_step


@pytest.mark.flex_fused
def test_drafter_with_an_eager_backend_wrapper():
    config = build_config("qwen27b-dflash", "full")
    _drafter, step = make_drafter_step(
        config, "cuda", torch.bfloat16, "eager-wrapper", backward=True, blocks=16, context_len=4096
    )
    step()
"""


@pytest.mark.gpu
def test_the_drafter_step_is_fused_and_the_eager_wrapper_is_dense_both_ways(pytester, evidence):
    pytester.makepyfile(
        test_training_step_fused=(ROOT / "docs" / "examples" / "test_training_step_fused.py").read_text(),
        test_eager_wrapper=_EAGER_WRAPPER,
    )
    result, outcomes = _run(pytester)
    (evidence / "pytest-output.txt").write_text(result.stdout.str() + result.stderr.str(), encoding="utf-8")
    assert outcomes["test_drafter_training_step_is_fused"] == ("passed", ""), result.stdout.str()
    status, message = outcomes["test_drafter_with_an_eager_backend_wrapper"]
    assert status == "failed"
    assert "ran its dense kernel 10 times (5 forward, 5 backward) from 5 call sites" in message
    for layer in (f"layers.{i}.self_attn" for i in range(5)):
        assert f"[error] dense-forward {layer}: flex_attention forward ran the dense kernel (1 call)" in message
        assert (
            f"[error] dense-backward {layer}: flex_attention backward ran the dense kernel (1 call) "
            "(the backward of the forward called there)"
        ) in message
    assert "bfloat16 on cuda:0" in message and "Cause: eager backend" in message
    assert "1 test watched; flex_attention ran its dense kernel in 1 of them, from 5 call sites" in result.stdout.str()
