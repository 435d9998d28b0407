"""Fires lint-raw-flex-call-on-purpose (reported only when selected): an eager reference, by its name,
beside the compiled wrapper it checks."""

import torch
from torch.nn.attention.flex_attention import flex_attention

compiled_flex = torch.compile(flex_attention)


def reference_attention(q, k, v):
    return flex_attention(q, k, v)  # ON_PURPOSE
