"""torchtune's packed-sequence flex_attention wrapper, copied for check-compile to be pointed at.

Source: github.com/pytorch/torchtune @ bd2a0fc7c31430972728494fa01aaeeb0ebf1ba1 (2026-04-23),
torchtune/modules/attention_utils.py lines 25-57: `compile_flex_attention`,
`flex_attention_compiled` and `compile_friendly_flex_attention`, taken out of their
`if _SUPPORTS_FLEX_ATTENTION:` block and otherwise unchanged but for `ruff format`; torchtune's
logger (`torchtune.utils._logging.get_logger()`) is a plain `logging.getLogger` here. At this
commit the wrapper compiles without `dynamic=False` (removed after v0.6.1, pytorch/torchtune#2765).

What it is for: `compile_friendly_flex_attention(q, k, v, block_mask)` takes no `enable_gqa`;
torchtune's MultiHeadAttention expands K/V to the query heads before calling it.

Licence of the copied lines, from the file's own header:
# Copyright (c) Meta Platforms, Inc. and affiliates.
# All rights reserved.
#
# This source code is licensed under the BSD-style license found in the
# LICENSE file in the root directory of this source tree.
(torchtune's LICENSE: BSD 3-Clause License, Copyright 2024 Meta.)
"""

import logging

import torch
from torch.nn.attention.flex_attention import BlockMask, flex_attention

_log: logging.Logger = logging.getLogger(__name__)


def compile_flex_attention():
    try:
        return torch.compile(flex_attention)
    except Exception as e:
        # It may fail on some combinations of hardware/versions. Using max-autotune fixes this issue.
        # Context: https://github.com/pytorch/torchtune/issues/2113
        _log.info(f"Compiling flex_attention failed with error '{e}'. Retrying with mode='max-autotune'.")
        try:
            return torch.compile(flex_attention, mode="max-autotune")
        except Exception as e:
            _log.info(
                f"Compiling flex_attention failed with error: '{e}', "
                "Updating your pytorch version to nightlies may solve it, or you can set"
                "in your config dataset.packed=False to avoid using flex attention."
            )
            raise


flex_attention_compiled = compile_flex_attention()


# We cannot do nested compile, but flex attention only has perf benefits
# when compiled. To insulate it from the compiler, we wrap it with
# compiler.disable so that it can be used regardless of whether the model
# is compiled or not, and flex attention always remains compiled.
@torch.compiler.disable(recursive=False)
def compile_friendly_flex_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    block_mask: BlockMask,
) -> torch.Tensor:
    return flex_attention_compiled(q, k, v, block_mask=block_mask)
