"""The gate's configuration is a composition of the probes' own Options (gate/config.py, filled by
gate/table.py), read from real files with load_config: a gate-wide key reaches every probe's options,
a key left out leaves the probe's own default (one default per option, in its Options), and the
flat keys teams already wrote each fill the field they always meant."""

from __future__ import annotations

from dataclasses import fields, replace
from pathlib import Path

import pytest

from dflashdoctor.budgets import Budgets
from dflashdoctor.errors import BadInput
from dflashdoctor.gate.config import GATE_PROBES, GateConfig
from dflashdoctor.gate.config_file import load_config
from dflashdoctor.gate.table import KEYS, field_type
from dflashdoctor.registry import PROBES


def _loaded(tmp_path: Path, text: str) -> GateConfig:
    (tmp_path / "dflashdoctor.toml").write_text(text)
    return load_config(None, tmp_path)[0]


def test_the_timeout_reaches_every_probe(tmp_path):
    config = _loaded(tmp_path, "timeout = 42.5\n")
    for name in GATE_PROBES:
        assert config.probe_options(name, None, None).timeout_s == 42.5, name


def test_a_key_left_out_is_the_probes_own_default(tmp_path):
    """Nothing in the gate restates a default: with an empty table each probe runs with its
    command's options as they come (the gate adds only where it runs, and trace-attention's drafter)."""
    config = _loaded(tmp_path, "")
    for name in GATE_PROBES:
        options = config.probe_options(name, "py", "host")
        own = replace(PROBES[name].options(), python="py", ssh="host")
        if name == "trace-attention":
            own = replace(own, drafter=True)
        assert options == own, name
    assert config.budgets == Budgets(held_by_gate=True)


def test_the_flat_keys_fill_the_options_they_name(tmp_path):
    config = _loaded(
        tmp_path,
        'target = "pkg.mod:fn"\ndevice = "cpu"\nmask = "causal"\nvary = 2\nmodel = "qwen3"\n'
        'triton_dir = "/scratch/triton"\nmax_recompiles = 4\nthreaded_autotuners = true\n[shape]\nheads = 4\n',
    )
    compiled, traced = config.check_compile, config.trace_attention
    assert (compiled.target, compiled.device, compiled.mask, compiled.vary) == ("pkg.mod:fn", "cpu", "causal", 2)
    assert compiled.shape == {"heads": 4} and compiled.max_recompiles == 4
    assert (traced.device, traced.model) == ("cpu", "qwen3")
    assert config.probe_options("trace-attention", None, None).drafter is False  # a model is traced instead
    assert config.cache.triton_dir == Path("/scratch/triton")
    assert config.budgets == Budgets(max_recompiles=4, threaded_autotuners=True, held_by_gate=True)


def test_every_key_fills_fields_of_one_type():
    """A gate-wide key fills the same kind of field everywhere: its value is checked against one type."""
    for key, places in KEYS.items():
        assert len({str(field_type(place)) for place in places}) == 1, key


def test_every_budget_is_a_key():
    assert {f.name for f in fields(Budgets)} - set(KEYS) == {"held_by_gate"}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("timeout = true\n", "timeout in {toml} must be float, not bool"),
        ("triton_dir = 3\n", "triton_dir in {toml} must be str | None, not int"),
        ("run = 3\n", "run in {toml} must be str | list[str] | None, not int"),
        ("timeout = 0\n", "timeout must be above 0 seconds, not 0"),
    ],
)
def test_a_bad_value_names_its_key(tmp_path, text, message):
    with pytest.raises(BadInput) as raised:
        _loaded(tmp_path, text)
    assert str(raised.value) == message.format(toml=tmp_path / "dflashdoctor.toml")
