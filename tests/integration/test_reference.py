"""The reference setup: the DFlash mask sees what the DFlash layout says, and targets are described right."""

from __future__ import annotations

import torch

from dflashdoctor.reference import drafter, masks
from dflashdoctor.reference.faults import raw_call, rebound
from dflashdoctor.targets import describe, resolve


def _dense(mask_mod, q_len: int, kv_len: int) -> torch.Tensor:
    q_idx = torch.arange(q_len)[:, None]
    kv_idx = torch.arange(kv_len)[None, :]
    return mask_mod(0, 0, q_idx, kv_idx)


def test_dflash_mask_sees_context_before_anchor_and_own_block():
    q_len, kv_len, block = 64, 320, 16
    context = kv_len - q_len
    anchors = masks.dflash_anchors(q_len, kv_len, block, "cpu").tolist()
    assert anchors == [64, 128, 192, 256]
    allowed = _dense(masks.dflash_mask_mod(q_len, kv_len, block, "cpu"), q_len, kv_len)
    for q in range(q_len):
        b = q // block
        expected = [kv < anchors[b] if kv < context else (kv - context) // block == b for kv in range(kv_len)]
        assert allowed[q].tolist() == expected


def test_causal_mask_aligns_queries_to_the_end():
    allowed = _dense(masks.causal_mask_mod(4, 10), 4, 10)
    assert allowed.sum(dim=1).tolist() == [7, 8, 9, 10]


def test_drafter_layer_runs_through_the_compiled_entry():
    torch._dynamo.reset()
    layer = drafter.DFlashDrafterAttention(hidden=64, heads=4, kv_heads=1, head_dim=16)
    draft, context = torch.randn(1, 32, 64), torch.randn(1, 96, 64)
    with torch.no_grad():  # flex_attention has no CPU backward, so parameters must not record grads
        out = layer(draft, context, drafter.drafter_block_mask(32, 128, "cpu"))
    assert out.shape == (1, 32, 64) and torch.isfinite(out).all()
    torch._dynamo.reset()


def test_describe_names_compiled_globals_and_rebinding():
    healthy = describe(*resolve("dflashdoctor.reference.drafter:flex_attention_forward"), "healthy")
    assert (healthy.kind, healthy.compiled_globals, healthy.rebound) == ("function", ["_compiled_flex_attention"], None)
    raw = describe(*resolve("dflashdoctor.reference.faults.raw_call:flex_attention_forward"), "raw")
    assert raw.raw_flex_globals == ["flex_attention"] and raw.rebound is None
    bad = describe(*resolve("dflashdoctor.reference.faults.rebound:flex_attention_forward"), "rebound")
    assert bad.rebound["name"] == "_compiled_flex_attention"
    assert bad.rebound["file"] == rebound.__file__
    assert raw_call.flex_attention is rebound._compiled_flex_attention


def test_mask_sparsity_counts_skipped_tiles():
    from torch.nn.attention.flex_attention import create_block_mask

    from dflashdoctor.hooks.call_stats import mask_sparsity_pct

    causal = create_block_mask(lambda b, h, q, kv: kv <= q, None, None, 1024, 1024, device="cpu")
    assert mask_sparsity_pct(causal) == causal.sparsity() == 43.75
    short = masks.build_block_mask("dflash", 64, 256, "cpu")  # shorter than one 128-row tile
    assert mask_sparsity_pct(short) == 0.0  # torch's own sparsity() goes negative here
    assert mask_sparsity_pct(None) is None
