# copied from facebookresearch/blt@9774ed4fcc78313f9f218295f3d7e4decdadf2ae: bytelatent/__init__.py
# Copyright (c) Meta Platforms, Inc. and affiliates.
class ByteLatentError(Exception):
    pass
