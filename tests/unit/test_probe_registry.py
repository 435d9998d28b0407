"""Every registered probe is whole: a CLI command, a docs page, a recording its judge's unit tests
read, and a judge unit test that proves every code its judge raises. A probe added to
`registry.PROBES` without one of them fails here, not in a user's hands; docs/architecture.md's
recipe for a new probe lists the same files."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import json
import re
import typing

import pytest

from dflashdoctor import cli, probe_configs
from dflashdoctor.registry import PROBES
from tests.paths import ROOT
from tests.unit.recorded import ASSETS


def _commands() -> set[str]:
    return {c.name for c in cli.app.registered_commands} | {g.name for g in cli.app.registered_groups}


@pytest.mark.parametrize("name", list(PROBES))
def test_a_registered_probe_has_a_command_a_page_and_a_recording(name):
    assert name in _commands(), f"{name} is registered but the CLI has no `{name}` command"
    assert (ROOT / "docs" / "commands" / f"{name}.md").is_file(), f"docs/commands/{name}.md is missing"
    prefixes = (f"{name}-", f"{name.split('-')[0]}-")  # trace-attention's recordings are trace-*
    recorded = [p.name for p in ASSETS.glob("*/*") if p.name.startswith(prefixes)]
    assert recorded, f"no recording of {name} under tests/assets/observations/"


@pytest.mark.parametrize("name", list(PROBES))
def test_a_registered_probes_judge_test_proves_every_code_its_judge_raises(name):
    judge = inspect.getmodule(PROBES[name].judge)
    assert judge is not None
    raised = set(re.findall(r'finding\(\s*"([a-z0-9-]+)"', inspect.getsource(judge)))
    module = f"tests.unit.test_{judge.__name__.rsplit('.', 1)[1]}_judge"
    proven = set(getattr(importlib.import_module(module), "CASES", {}))
    assert raised, f"{judge.__name__} raises no finding the test can read"
    assert raised <= proven, f"{module}.CASES lacks {sorted(raised - proven)}"


def test_the_registry_names_each_probe_by_its_specs_name():
    assert all(spec.name == name for name, spec in PROBES.items())


_GENERIC = [name for name, spec in PROBES.items() if spec.probe_config is not None]


def _script_config(script: str) -> str:
    """The config class a probe script loads: the one it gives probe_main."""
    found = re.findall(r"probe_main\(run, (\w+)\)", (ROOT / "probes" / script).read_text(encoding="utf-8"))
    assert len(found) == 1, f"probes/{script} does not call probe_main(run, <its config class>) once"
    return found[0]


@pytest.mark.parametrize("name", _GENERIC)
def test_a_registered_probes_config_is_the_typed_config_its_script_loads(name):
    """The hook returns the dataclass its annotation names, the one the script loads, and it comes
    back equal from the JSON the runner writes: no field the JSON loses, none the script refuses."""
    spec = PROBES[name]
    assert spec.probe_config is not None and spec.script is not None
    config = spec.probe_config(spec.options())
    declared = typing.get_type_hints(spec.probe_config)["return"]
    assert type(config) is declared and dataclasses.is_dataclass(config)
    assert declared is getattr(probe_configs, _script_config(spec.script))
    assert probe_configs.load_config(declared, json.loads(probe_configs.to_json(config))) == config


def test_every_probe_script_loads_a_config_of_probe_configs():
    """Those without a probe_config hook too (cache check over ssh, the gate's run on a node)."""
    for script in (ROOT / "probes").glob("[!_]*.py"):
        assert dataclasses.is_dataclass(getattr(probe_configs, _script_config(script.name), None)), script.name
