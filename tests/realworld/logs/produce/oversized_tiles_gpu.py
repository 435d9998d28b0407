"""A compiled flex_attention wrapper with kernel_options whose tiles do not fit a GPU's shared
memory (tests/targets/oversized_tiles.py), called for one training step at head_dim 256 in float32.
Produces `39_produced_h200_flex_tiles_out_of_resources.log`."""

import torch

from tests.targets.oversized_tiles import too_large

query = torch.randn(1, 4, 1024, 256, device="cuda", requires_grad=True)
key = torch.randn(1, 4, 1024, 256, device="cuda", requires_grad=True)
too_large(query, key, key).sum().backward()
print("step ok", flush=True)
