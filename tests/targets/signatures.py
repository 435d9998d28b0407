"""Wrappers of one compiled flex_attention with the signatures real ones have, for check-compile's
call plan: each is healthy, so each must pass, called the way its own callers call it."""

import torch
from torch.nn.attention.flex_attention import flex_attention

_compiled = torch.compile(flex_attention)


def positional_block_mask(query, key, value, block_mask, /):
    """block_mask can only go fourth; no enable_gqa, so GQA heads arrive expanded."""
    return _compiled(query, key, value, block_mask=block_mask)


def mask_only(q, k, v, mask):
    """`(q, k, v, mask)` and nothing else."""
    return _compiled(q, k, v, block_mask=mask)


def extra_keywords(query, key, value, block_mask=None, *, scale=None, dropout_p=0.0, layer_idx=0, enable_gqa=False):
    """Keyword arguments of its own, each with a default; enable_gqa among them."""
    assert dropout_p == 0.0 and layer_idx == 0
    return _compiled(query, key, value, block_mask=block_mask, scale=scale, enable_gqa=enable_gqa)


def needs_layer(query, key, value, block_mask, layer_idx):
    """A required parameter check-compile has nothing to pass to."""
    return _compiled(query, key, value, block_mask=block_mask)


class FlexAttention(torch.nn.Module):
    """A module whose forward takes `attn_mask`; compiled whole, as models are."""

    def forward(self, q, k, v, attn_mask=None):
        return flex_attention(q, k, v, block_mask=attn_mask)


compiled_module = torch.compile(FlexAttention())
