"""Where the gate's configuration comes from: a file given with --config, ./dflashdoctor.toml,
`[tool.dflashdoctor]` in ./pyproject.toml, or the defaults (the embedded reference setup). The file
is read as a file another user may have placed (placed_files.py), and refused before it is read when
another user could have written it (trust.py): its `run`, `target` and `script` run code."""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dflashdoctor.errors import BadInput
from dflashdoctor.gate.config import GateConfig
from dflashdoctor.gate.table import filled
from dflashdoctor.placed_files import MIB, PlacedFileError, read_placed
from dflashdoctor.safe_fs import user_name
from dflashdoctor.trust import Trust


def _from_table(table: dict[str, Any], source: str) -> GateConfig:
    config = filled(GateConfig(), table, source)
    config.validate()
    return config


_CONFIG_BYTES = 4 * MIB


def _read(path: Path) -> dict[str, Any]:
    """The configuration file: a regular file of at most 4 MiB (a FIFO or /dev/zero given as
    --config is refused at once, not read until the machine runs out of memory)."""
    try:
        return tomllib.loads(read_placed(path, _CONFIG_BYTES, follow=True).decode("utf-8"))
    except PlacedFileError as exc:
        raise BadInput(str(exc)) from None
    except OSError as exc:
        raise BadInput(f"cannot read {path}: {exc.strerror}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:  # TOML is UTF-8: a stray byte is not TOML
        raise BadInput(f"{path} is not valid TOML: {exc}") from None
    except RecursionError:  # arrays nested thousands deep
        raise BadInput(f"{path} is not a configuration: its values nest too deep") from None
    except ValueError as exc:  # an integer past the 4,300 digits Python converts
        raise BadInput(f"{path} is not a configuration: {exc}") from None


@dataclass(frozen=True)
class ConfigSource:
    """Where the configuration came from: the file and its owner (both in the report), or the defaults."""

    path: Path | None
    owner: str | None = None

    def describe(self) -> str:
        return str(self.path) if self.path is not None else "defaults (the embedded reference setup)"


def load_config(explicit: Path | None, cwd: Path, trust: Trust | None = None) -> tuple[GateConfig, ConfigSource]:
    """The configuration and where it came from: --config, ./dflashdoctor.toml, ./pyproject.toml's
    [tool.dflashdoctor], else the defaults (the embedded reference setup). A file whose `run`,
    `target` or `script` another user could have written is refused before it is read (trust.py)."""
    trust = trust or Trust()
    candidates = [explicit] if explicit is not None else [cwd / "dflashdoctor.toml", cwd / "pyproject.toml"]
    for path in candidates:
        if path is None or (explicit is None and not path.is_file()):
            continue
        refused = trust.file_problem(path, "the configuration")
        if refused:
            raise BadInput(refused)
        data = _read(path)
        source = ConfigSource(path, _owner(path))
        if path.name == "pyproject.toml" or "tool" in data:
            tool = data.get("tool", {})
            table = tool.get("dflashdoctor") if isinstance(tool, dict) else None
            if table is not None and not isinstance(table, dict):
                raise BadInput(f"{path}: tool.dflashdoctor must be a table")
            if table is None:
                if explicit is not None:
                    raise BadInput(f"{path} has no [tool.dflashdoctor] table")
                continue
            outside = sorted(key for key in data if key != "tool")
            if outside and path.name != "pyproject.toml":
                raise BadInput(
                    f"{path} has both [tool.dflashdoctor] and top-level keys ({', '.join(outside[:3])}): "
                    "keep the configuration in one of them"
                )
            return _from_table(table, f"{path} [tool.dflashdoctor]"), source
        return _from_table(data, str(path)), source
    return GateConfig(), ConfigSource(None)


def _owner(path: Path) -> str | None:
    try:
        return user_name(os.stat(path).st_uid)
    except OSError:
        return None
