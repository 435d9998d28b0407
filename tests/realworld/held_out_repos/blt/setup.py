# copied from facebookresearch/blt@9774ed4fcc78313f9f218295f3d7e4decdadf2ae: setup.py
from setuptools import find_packages, setup

setup(
    name="bytelatent",
    version="0.1.0",
    description="Byte Latent Transformer: Patches Scale Better Than Tokens",
    author="Meta Platforms, Inc. and affiliates.",
    url="https://github.com/facebookresearch/blt",
    packages=find_packages(),
    install_requires=["sentencepiece", "tiktoken", "xformers"],
)
