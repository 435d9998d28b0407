"""A debugging patch the launcher_rebound.py case runs with runpy.run_path (`--rebind runpy`): it makes
flex attention run uncompiled "for determinism", as pytorch/torchtitan@06562f393dba9e79a37d733ac3487fc89b26c858
torchtitan/distributed/utils.py (`set_determinism`, on ROCm) does. Re-written in our own words.
"""

from titan_attention_module import FlexAttention
from torch.nn.attention.flex_attention import flex_attention

FlexAttention._compiled_flex_attn = flex_attention
