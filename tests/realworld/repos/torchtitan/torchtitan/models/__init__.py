# copied from pytorch/torchtitan@b5bcd76c66d0acb1a08b176d9639425bc55e0b2a: torchtitan/models/__init__.py
# Copyright (c) Meta Platforms, Inc. and affiliates.
# All rights reserved.
#
# This source code is licensed under the BSD-style license found in the
# LICENSE file in the root directory of this source tree.

_supported_models = frozenset(
    [
        "deepseek_v3",
        "flux",
        "gpt_oss",
        "kimi_k2_7",
        "llama3",
        "muse_glimmer",
        "qwen3",
        "qwen3_5",
    ]
)
