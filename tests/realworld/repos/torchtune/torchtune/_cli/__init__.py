# copied from pytorch/torchtune@bd2a0fc7c31430972728494fa01aaeeb0ebf1ba1: torchtune/_cli/__init__.py
# Copyright (c) Meta Platforms, Inc. and affiliates.
# All rights reserved.
#
# This source code is licensed under the BSD-style license found in the
# LICENSE file in the root directory of this source tree.
