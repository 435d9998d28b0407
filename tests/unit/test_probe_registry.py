"""Every registered probe is whole: a CLI command, a docs page and a recording its judge's unit tests
read. A probe added to `registry.PROBES` without one of them fails here, not in a user's hands."""

from __future__ import annotations

import pytest

from dflashdoctor import cli
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


def test_the_registry_names_each_probe_by_its_specs_name():
    assert all(spec.name == name for name, spec in PROBES.items())
