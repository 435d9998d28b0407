"""The healthy twins: a wrapper compiled with Inductor, called through; a compiled function calling
flex_attention; a prefix-LM whose prefix is a tensor the mask closes over."""

import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

compiled_flex = torch.compile(flex_attention, dynamic=True)


class FlexAttentionWrapper(torch.nn.Module):
    _compiled_flex_attn = torch.compile(flex_attention)

    def forward(self, q, k, v, block_mask):
        return FlexAttentionWrapper._compiled_flex_attn(q, k, v, block_mask=block_mask)


@torch.compile
def compiled_attention(q, k, v):
    return flex_attention(q, k, v)


def attend(q, k, v, prefix: torch.Tensor):
    def prefix_lm(b, h, q_idx, kv_idx):
        return (kv_idx <= q_idx) | (kv_idx < prefix)

    mask = create_block_mask(prefix_lm, None, None, q.shape[-2], k.shape[-2], device="cpu")
    return compiled_flex(q, k, v, block_mask=mask)
