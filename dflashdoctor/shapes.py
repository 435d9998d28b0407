"""Attention shapes for the probes: defaults per device, and what makes a shape impossible.

Standard library only: the doctor validates what it can before starting a probe, and the probe
applies the device defaults once it knows which device `auto` became.

`AttentionShape` is the one definition of the shape: check-compile's options (`--batch` ...
`--dtype`, with their help) and the gate's `shape` keys are its OPTION_FIELDS, and check-compile's
observations keep it as it is (the JSON of its fields).
"""

from __future__ import annotations

import typing
from dataclasses import Field, asdict, dataclass, field, fields, replace
from typing import Any

DTYPES = ("bfloat16", "float16", "float32", "float64")
DEVICES = ("auto", "cpu", "cuda")
MASKS = ("dflash", "causal", "none")


def _option(help: str) -> Any:
    """A field the user sets (check-compile's `--<name>`, the gate's `shape.<name>`), and its help."""
    return field(metadata={"help": help})


@dataclass(frozen=True)
class AttentionShape:
    batch: int = _option("Batch size")
    heads: int = _option("Query heads")
    kv_heads: int = _option("Key/value heads")
    q_len: int = _option("Query length")
    kv_len: int = _option("Key/value length")
    head_dim: int = _option("Head dimension")
    dtype: str = _option(f"{', '.join(DTYPES[:-1])} or {DTYPES[-1]}")
    block_size: int = 16  # the DFlash mask's draft block: no option sets it

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def label(self) -> str:
        return (
            f"B{self.batch} H{self.heads}/{self.kv_heads} q{self.q_len} kv{self.kv_len} d{self.head_dim} {self.dtype}"
        )


# The measured DFlash shape: 128 anchors of 16 draft tokens over 8192 context tokens.
CUDA_DEFAULT = AttentionShape(1, 32, 8, 2048, 10240, 128, "bfloat16")
# The same structure (GQA 4:1, kv = 5 x q, blocks of 16) scaled so a CPU probe takes seconds.
CPU_DEFAULT = AttentionShape(1, 8, 2, 256, 1280, 64, "float32")


def default_shape(device: str) -> AttentionShape:
    return CUDA_DEFAULT if device == "cuda" else CPU_DEFAULT


def shape_with(device: str, overrides: dict[str, Any]) -> AttentionShape:
    """The device default with the given (non-None) fields replaced."""
    given = {k: v for k, v in overrides.items() if v is not None}
    return replace(default_shape(device), **given)


# The fields a user sets, in their options' order, and every field's type (an option's too).
OPTION_FIELDS: tuple[Field[Any], ...] = tuple(f for f in fields(AttentionShape) if "help" in f.metadata)
FIELD_TYPES: dict[str, type] = typing.get_type_hints(AttentionShape)

# No tensor dimension torch indexes with 32-bit kernels goes past this; nothing real comes near it.
MAX_SIZE = 2**31 - 1


def shape_problem(shape: AttentionShape, mask: str) -> str | None:
    """Why this shape cannot run, in one line, or None when it can."""
    for name in (name for name, kind in FIELD_TYPES.items() if kind is int):
        value = getattr(shape, name)
        if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_SIZE:
            return f"--{name.replace('_', '-')} must be a whole number from 1 to {MAX_SIZE} (got {value!r})"
    if shape.dtype not in DTYPES:
        return f"unknown dtype {shape.dtype!r}; expected one of {', '.join(DTYPES)}"
    if shape.heads % shape.kv_heads:
        return f"--heads {shape.heads} is not a multiple of --kv-heads {shape.kv_heads}"
    if shape.head_dim < 16:
        return f"--head-dim {shape.head_dim} is below flex_attention's minimum of 16"
    if mask == "dflash":
        if shape.kv_len <= shape.q_len:
            return (
                f"the dflash mask needs context before the draft blocks: --kv-len {shape.kv_len} "
                f"must exceed --q-len {shape.q_len}"
            )
        if shape.q_len % shape.block_size:
            return f"the dflash mask needs --q-len {shape.q_len} to be a multiple of the block size {shape.block_size}"
    return None
