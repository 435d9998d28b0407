"""Attention masks of the reference setup, one mask function per builder.

The DFlash training layout: KV = [context (S tokens) | block 0 | ... | block N-1] and
Q = [block 0 | ... | block N-1]. A query in draft block i sees the context before block i's anchor
and all of block i, nothing else. The mask reads only tensors captured in its closure, never a
changing Python number: dynamo guards on Python numbers, and a new value per call would recompile
until the recompile limit silently drops flex_attention back to the dense kernel.
"""

from __future__ import annotations

import torch
from torch.nn.attention.flex_attention import BlockMask, create_block_mask

from dflashdoctor.shapes import MASKS

DEFAULT_BLOCK_SIZE = 16


def dflash_anchors(q_len: int, kv_len: int, block_size: int, device: torch.device | str) -> torch.Tensor:
    """Anchor position of each draft block, spread evenly over the context.

    Block i is anchored after context token (i + 1) * S / N, so early blocks see little context and
    the last block sees all of it, as in training on sampled anchors.
    """
    blocks = q_len // block_size
    context = kv_len - q_len
    steps = torch.arange(1, blocks + 1, device=device, dtype=torch.int64)
    return (steps * context) // blocks


def dflash_mask_mod(q_len: int, kv_len: int, block_size: int, device: torch.device | str):
    """mask_mod for the DFlash layout: context before the block's anchor, plus the block itself.

    Only tensors sized by the queries are indexed (`anchors[q_block]`); keys are compared against
    the context length held in a 0-d tensor. Indexing a captured tensor as long as the keys
    (`per_key[kv_idx]`) broke Inductor's CPU flex template once the key length turned dynamic
    (C++ compile error on torch 2.13), so the mask avoids it.
    """
    context = torch.tensor(kv_len - q_len, device=device)
    anchors = dflash_anchors(q_len, kv_len, block_size, device)

    def mask_mod(b, h, q_idx, kv_idx):
        q_block = q_idx // block_size
        sees_context = (kv_idx < context) & (kv_idx < anchors[q_block])
        own_block = (kv_idx >= context) & ((kv_idx - context) // block_size == q_block)
        return sees_context | own_block

    return mask_mod


def causal_mask_mod(q_len: int, kv_len: int):
    """Causal mask with the queries aligned to the end of the keys (decoder-style suffix)."""
    offset = torch.tensor(kv_len - q_len)

    def mask_mod(b, h, q_idx, kv_idx):
        return kv_idx <= q_idx + offset

    return mask_mod


def build_block_mask(
    kind: str,
    q_len: int,
    kv_len: int,
    device: torch.device | str,
    block_size: int = DEFAULT_BLOCK_SIZE,
) -> BlockMask | None:
    """The BlockMask for `kind` ("dflash", "causal" or "none": full attention, no mask)."""
    if kind == "none":
        return None
    if kind == "dflash":
        mask_mod = dflash_mask_mod(q_len, kv_len, block_size, device)
    elif kind == "causal":
        mask_mod = causal_mask_mod(q_len, kv_len)
    else:
        raise ValueError(f"unknown mask {kind!r}; expected one of {', '.join(MASKS)}")
    return create_block_mask(mask_mod, B=None, H=None, Q_LEN=q_len, KV_LEN=kv_len, device=device)
