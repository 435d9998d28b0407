"""An eager flex_attention call at a known line (FLEX_LINE): runs the dense kernel."""

import torch
from torch.nn.attention.flex_attention import flex_attention

q = k = v = torch.randn(1, 2, 128, 16)
out = flex_attention(q, k, v)  # FLEX_LINE
print("eager flex done", tuple(out.shape))
