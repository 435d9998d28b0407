"""A user file whose attribute is a torch.compile wrapper of flex_attention itself."""

import torch
from torch.nn.attention.flex_attention import flex_attention

compiled_flex = torch.compile(flex_attention)

# Compiled, but with a backend that never reaches Inductor: flex_attention still runs dense.
debug_compiled_flex = torch.compile(flex_attention, backend="aot_eager")
