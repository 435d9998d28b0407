"""The call-site recorders put back everything they patch (never break the patient)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.attention.flex_attention as flex_module
from transformers.modeling_utils import AttentionInterface

from dflashdoctor.hooks.flex_calls import FlexCallRecorder
from dflashdoctor.hooks.flex_dense import DenseFlexRecorder
from dflashdoctor.hooks.hf_attention import HFAttentionRecorder
from dflashdoctor.hooks.module_names import ModuleNamer


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def test_flex_call_recorder_restores_flex_attention_and_torch_compile():
    raw, real_compile = flex_module.flex_attention, torch.compile
    with FlexCallRecorder(DenseFlexRecorder(), ModuleNamer()):
        assert flex_module.flex_attention is not raw
        assert torch.compile is not real_compile
        assert flex_module.flex_attention.__wrapped__ is raw
    assert flex_module.flex_attention is raw
    assert torch.compile is real_compile


def test_raw_call_through_the_stand_in_is_recorded_with_its_module():
    class Attention(torch.nn.Module):
        def forward(self, x):
            return flex_module.flex_attention(x, x, x)

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.attn = Attention()

        def forward(self, x):
            return self.attn(x)

    dense = DenseFlexRecorder()
    with dense, FlexCallRecorder(dense, ModuleNamer()) as recorder:
        Model()(torch.randn(1, 2, 32, 16))
    (site,) = recorder.sites.values()
    assert (site.module, site.via, site.calls, site.dense_forward) == ("attn", "raw flex_attention", 1, 1)
    assert site.function == "forward" and site.file == __file__


def test_attention_interface_recorder_restores_every_entry():
    before = dict(AttentionInterface._global_mapping)
    with HFAttentionRecorder(None, DenseFlexRecorder(), ModuleNamer()):
        assert all(AttentionInterface._global_mapping[k] is not v for k, v in before.items())
    assert AttentionInterface._global_mapping == before
