"""Fires lint-mod-reads-global: attention-gym's prefix-LM written with a module-level int set per batch."""

import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

PREFIX_LENGTH = 0
compiled_flex = torch.compile(flex_attention)


def prefix_lm(b, h, q_idx, kv_idx):
    return (kv_idx <= q_idx) | (kv_idx < PREFIX_LENGTH)  # GLOBAL_READ


def attend(q, k, v, prefix):
    global PREFIX_LENGTH
    PREFIX_LENGTH = prefix
    mask = create_block_mask(prefix_lm, None, None, q.shape[-2], k.shape[-2], device="cpu")
    return compiled_flex(q, k, v, block_mask=mask)
