"""Fires lint-wrapper-static-varying: torchtune's `torch.compile(flex_attention, dynamic=False)`
wrapper, called through a function that passes its arguments on, with packed sequences whose length
changes every step; and a method compiled with dynamic=False, called with a prefix that grows."""

import torch
from torch.nn.attention.flex_attention import flex_attention

flex_attention_compiled = torch.compile(flex_attention, dynamic=False)  # STATIC_WRAPPER


def compile_friendly_flex_attention(q, k, v, block_mask=None):
    return flex_attention_compiled(q, k, v, block_mask=block_mask)


class Decoder(torch.nn.Module):
    @torch.compile(dynamic=False)  # STATIC_DECORATED
    def attend(self, q, k, v):
        return flex_attention(q, k, v)

    def generate(self, q, steps):
        length = 16
        while length < steps:
            length += 16
            prefix = q[:, :, :length]
            self.attend(prefix, prefix, prefix)  # GROWING_CALL


def train(batches):
    for batch in batches:
        length = batch.shape[-2]
        q = torch.randn(1, 4, length, 16)
        compile_friendly_flex_attention(q, q, q)  # VARYING_CALL
