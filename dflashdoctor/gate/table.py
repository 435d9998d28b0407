"""The gate's table (`[tool.dflashdoctor]`, dflashdoctor.toml) into a GateConfig: each key fills
the fields it names in the probes' own Options, the budgets, or the gate's own settings.

The keys are flat and stay as teams wrote them (`target`, `mask`, `triton_dir`, ...); where each one
goes is the one table below, and its type is the type of the field it fills, read from the dataclass
that declares it. So no option is restated here with a copied default or type. A key that fills a
field in several probes' options is gate-wide: `device` reaches check-compile and trace-attention,
`timeout` every probe. The command line's overrides (`--target`, `--device`, `--run`, `--script`) go
through the same table. An unknown key or a value of the wrong type is bad input (exit 2): a typo in
a budget must never pass silently."""

from __future__ import annotations

import types
import typing
from collections.abc import Mapping
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

from dflashdoctor.budgets import Budgets
from dflashdoctor.errors import BadInput
from dflashdoctor.gate.config import GATE_PROBES, GateConfig, options_field

_OWN = "gate"  # a setting of the gate's own: a field of GateConfig
_BUDGETS = "budgets"
Place = tuple[str, str]  # (a probe's name, _BUDGETS or _OWN; the field there)

_PROBE_KEYS: dict[str, tuple[Place, ...]] = {
    "target": (("check-compile", "target"),),
    "device": (("check-compile", "device"), ("trace-attention", "device")),
    "shape": (("check-compile", "shape"),),
    "mask": (("check-compile", "mask"),),
    "vary": (("check-compile", "vary"),),
    "model": (("trace-attention", "model"),),
    "script": (("trace-attention", "script"),),
    "expect_wrapper": (("trace-attention", "expect_wrapper"),),
    "triton_dir": (("cache", "triton_dir"),),
    "inductor_dir": (("cache", "inductor_dir"),),
    "timeout": tuple((probe, "timeout_s") for probe in GATE_PROBES),
}
# Every budget but held_by_gate; check-compile's own count (its --max-recompiles alone) follows the budget.
_BUDGET_KEYS: dict[str, tuple[Place, ...]] = {
    item.name: ((_BUDGETS, item.name),) for item in fields(Budgets) if item.name != "held_by_gate"
}
_BUDGET_KEYS["max_recompiles"] += (("check-compile", "max_recompiles"),)
_COMPOSED = {_BUDGETS, *map(options_field, GATE_PROBES)}  # GateConfig's fields that are parts, not settings
_OWN_KEYS: dict[str, tuple[Place, ...]] = {
    item.name: ((_OWN, item.name),) for item in fields(GateConfig) if item.name not in _COMPOSED
}
# Every key of the table, and the fields it fills.
KEYS: dict[str, tuple[Place, ...]] = {**_PROBE_KEYS, **_BUDGET_KEYS, **_OWN_KEYS}

_CLASSES: dict[str, type] = {
    **{probe: type(options) for probe, options in GateConfig().options().items()},
    _BUDGETS: Budgets,
    _OWN: GateConfig,
}


def field_type(place: Place) -> object:
    """The type of the field a key fills, from the dataclass that declares it."""
    where, name = place
    hint: object = typing.get_type_hints(_CLASSES[where])[name]
    return hint


def filled(config: GateConfig, table: Mapping[str, object], source: str) -> GateConfig:
    """`config` with each key of `table` set in every field it fills; `source` names the table in
    what is said of a bad key. `[tool.dflashdoctor.lint]` is lint's own table (lint/settings.py)."""
    changes: dict[str, dict[str, Any]] = {}
    for key, value in table.items():
        name = key.replace("-", "_")
        if name == "lint" and isinstance(value, dict):
            continue
        if name not in KEYS:
            raise BadInput(f"unknown key {key!r} in {source}; known keys: {', '.join(sorted(KEYS))}")
        for where, field_name in KEYS[name]:
            changes.setdefault(where, {})[field_name] = _typed(key, value, field_type((where, field_name)), source)
    options = config.options()
    parts: dict[str, Any] = {
        options_field(probe): replace(options[probe], **changes[probe]) for probe in GATE_PROBES if probe in changes
    }
    if _BUDGETS in changes:
        parts[_BUDGETS] = replace(config.budgets, **changes[_BUDGETS])
    return replace(config, **parts, **changes.get(_OWN, {}))


def _typed(key: str, value: object, hint: object, source: str) -> Any:
    """The value as its field holds it (a path as a Path), or bad input naming the key. Checked here,
    at run time, against the field's type read at run time: a type no static checker can follow to
    the `replace` that sets the field, hence Any."""
    if not _accepts(hint, value):
        raise BadInput(f"{key} in {source} must be {_described(hint)}, not {type(value).__name__}")
    return Path(value) if isinstance(value, str) and _holds_path(hint) else value


def _alternatives(hint: object) -> tuple[object, ...]:
    """The types of a union (`str | None`), or the one type."""
    union = typing.get_origin(hint) in (types.UnionType, typing.Union)
    return typing.get_args(hint) if union else (hint,)


def _accepts(hint: object, value: object) -> bool:
    """Whether TOML's `value` may fill a field of type `hint`; a list's or a table's members are
    checked by GateConfig.validate, which names them."""
    return any(_is(kind, value) for kind in _alternatives(hint))


def _is(kind: object, value: object) -> bool:
    """A bool is no number, an integer is a float, a path is a string."""
    if kind is Any:
        return True
    if isinstance(value, bool):
        return kind is bool
    if kind is float:
        return isinstance(value, int | float)
    if kind is Path:
        return isinstance(value, str)
    container = typing.get_origin(kind) or kind
    return isinstance(container, type) and isinstance(value, container)


def _holds_path(hint: object) -> bool:
    return Path in _alternatives(hint)


def _described(hint: object) -> str:
    """A field's type as a TOML user reads it: `int`, `str | None`, `dict[str, Any]`; a path is a `str`."""
    kinds = _alternatives(hint)
    if len(kinds) > 1:
        return " | ".join(map(_described, kinds))
    if hint is Path:
        return "str"
    if hint is Any or hint is type(None):
        return "Any" if hint is Any else "None"
    origin, members = typing.get_origin(hint), typing.get_args(hint)
    if origin is not None:
        return f"{getattr(origin, '__name__', origin)}[{', '.join(map(_described, members))}]"
    return str(getattr(hint, "__name__", hint))
