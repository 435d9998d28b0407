"""Fires lint-wrapper-not-inductor: a wrapper compiled with a backend that generates no kernels."""

import torch
from torch.nn.attention.flex_attention import flex_attention

compiled_flex = torch.compile(flex_attention, backend="eager", dynamic=False)  # EAGER_WRAPPER
