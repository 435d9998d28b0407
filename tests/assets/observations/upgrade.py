"""Brings recordings made by earlier versions to the keys this version's probes write, so that
every test can load them strictly (`observations.load(..., strict=True)`), and a `run` recording's
event lines to the record types its reader checks (records.py, runs/events.EVENT_TYPES).

A key added to a probe after a recording was made is filled with what the judges saw for it
before, when the loader was not strict: a field's default, or None (an empty list for a list) for
a record's key. Nothing the probe wrote is changed or dropped; a key this version does not know is
an error, to be looked at, not removed. Run: `python3 tests/assets/observations/upgrade.py`; it
rewrites only the files it changes and names them.
"""

from __future__ import annotations

import json
import sys
import types
import typing
from dataclasses import MISSING, fields, is_dataclass
from pathlib import Path
from typing import Any

from dflashdoctor.observations import BlockObservations, RunSnapshot, load
from dflashdoctor.records import EventRecord
from dflashdoctor.registry import PROBES
from dflashdoctor.runs.events import EVENT_TYPES, well_formed

HERE = Path(__file__).parent
_DOCTOR_SIDE = ("run",)  # its observations are not loaded through load()


def _filled(hint: Any, value: Any) -> Any:
    """`value` with every key its hint names and it lacks, at any depth."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        members = [a for a in args if a is not type(None)]
        return _filled(members[0], value) if value is not None and len(members) == 1 else value
    if origin is list and isinstance(value, list):
        return [_filled(args[0], item) for item in value]
    if origin is dict and isinstance(value, dict) and args:
        return {key: _filled(args[1], item) for key, item in value.items()}
    if isinstance(value, dict) and (typing.is_typeddict(hint) or (isinstance(hint, type) and is_dataclass(hint))):
        hints = typing.get_type_hints(hint, vars(sys.modules[hint.__module__]), include_extras=True)
        if is_dataclass(hint):
            hints = {f.name: hints[f.name] for f in fields(hint) if f.metadata.get("written", True)}
        result = dict(value)
        for key, key_hint in hints.items():
            if typing.get_origin(key_hint) is typing.NotRequired:
                if key in result:
                    result[key] = _filled(typing.get_args(key_hint)[0], result[key])
                continue
            if key not in result:
                result[key] = _absent(hint, key, key_hint)
            else:
                result[key] = _filled(key_hint, result[key])
        return result
    return value


def _absent(owner: Any, key: str, hint: Any) -> Any:
    if is_dataclass(owner):
        field = next(f for f in fields(owner) if f.name == key)
        if field.default is not MISSING:
            return field.default
        if field.default_factory is not MISSING:
            return field.default_factory()
    if typing.get_origin(hint) is list:
        return []
    if type(None) in typing.get_args(hint):
        return None
    raise ValueError(f"{owner.__name__}.{key} ({hint}) has no value that stands for 'not recorded'")


def upgrade(path: Path) -> bool:
    document = json.loads(path.read_text(encoding="utf-8"))
    if "block" in document:
        parts = {"block": BlockObservations}
        holder = document
    else:
        holder = document.get("probes", {})
        parts = {name: PROBES[name].observations for name in holder if name not in _DOCTOR_SIDE}
    changed = False
    for name, cls in parts.items():
        upgraded = _filled(cls, holder[name])
        load(cls, upgraded, strict=True)  # what is still wrong is named here, not written
        if upgraded != holder[name]:
            holder[name] = upgraded
            changed = True
    if changed:
        path.write_text(json.dumps(document, indent=1, ensure_ascii=True) + "\n", encoding="utf-8")
    return changed


def upgrade_events(path: Path) -> bool:
    """A `run` recording's event file: each line filled to its kind's record type, a snapshot's
    observations to RunSnapshot; a line still short of its type is named, not written."""
    lines = path.read_text(encoding="utf-8").splitlines()
    records = [json.loads(line) for line in lines]
    upgraded = []
    for record in records:
        kind = record["kind"]
        filled = _filled(EVENT_TYPES.get(kind, EventRecord), record)
        if kind == "snapshot":
            filled["observations"] = _filled(RunSnapshot, filled["observations"])
            load(RunSnapshot, filled["observations"], strict=True)
        if not well_formed(filled):
            raise ValueError(f"line {len(upgraded) + 1} ({kind}) is still not of its type")
        upgraded.append(filled)
    if upgraded == records:
        return False
    path.write_text("".join(json.dumps(record, default=str) + "\n" for record in upgraded), encoding="utf-8")
    return True


if __name__ == "__main__":
    recordings = [p for p in sorted(HERE.glob("*/*.json")) if not p.name.endswith("report.json")]
    for recording in [*recordings, *sorted(HERE.glob("**/*.jsonl"))]:
        try:
            if (upgrade_events if recording.suffix == ".jsonl" else upgrade)(recording):
                print(f"upgraded {recording.relative_to(HERE)}")
        except (ValueError, KeyError) as exc:  # ObservationsError is a ValueError
            print(f"NOT upgraded {recording.relative_to(HERE)}: {exc}")
