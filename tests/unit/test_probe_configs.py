"""A probe's config is loaded strictly on the probed side: a key unknown or missing, or a value of
another type, is refused with an error naming where, never read as a default or a KeyError deep in
the probe. The doctor sent it, so the doctor's report calls it a probe failure (our bug)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from dflashdoctor.budgets import Budgets
from dflashdoctor.probe_configs import CheckCompileConfig, ConfigError, RunSmokeConfig, load_config, to_json
from tests.paths import ROOT

GOOD = CheckCompileConfig(target="m:f", device="cpu", shape={"heads": 4, "dtype": "float32"}, mask="dflash", vary=2)


def _changed(**changes: object) -> dict[str, object]:
    return {**json.loads(to_json(GOOD)), **changes}


@pytest.mark.parametrize(
    ("data", "said"),
    [
        (_changed(varry=3), "probe config CheckCompileConfig: unknown key 'varry'"),
        ({k: v for k, v in _changed().items() if k != "mask"}, "probe config CheckCompileConfig: missing 'mask'"),
        (_changed(vary="2"), "probe config CheckCompileConfig.vary: expected int, got str"),
        (_changed(vary=True), "probe config CheckCompileConfig.vary: expected int, got bool"),
        (_changed(shape={"heads": 4.5}), "CheckCompileConfig.shape['heads']: fits none of"),
        (_changed(shape={"heads": "4"}), "CheckCompileConfig.shape['heads']: expected int, got str"),
        (_changed(shape={"dtype": 16}), "CheckCompileConfig.shape['dtype']: expected str, got int"),
        (_changed(shape={"hedas": 4}), "CheckCompileConfig.shape: unknown key 'hedas'"),
        ([], "probe config CheckCompileConfig: expected an object, got list"),
    ],
)
def test_a_config_that_is_not_its_probes_is_refused_naming_where(data, said):
    with pytest.raises(ConfigError) as refused:
        load_config(CheckCompileConfig, data)
    assert said in str(refused.value)


def test_a_config_comes_back_equal_nested_dataclasses_included():
    config = RunSmokeConfig(["python", "t.py"], 3, 60, Budgets(max_compile_seconds=9.5), "/w", ["dflashdoctor", "gate"])
    assert load_config(RunSmokeConfig, json.loads(to_json(config))) == config


def test_a_probe_process_refuses_a_config_it_does_not_read(tmp_path):
    """A real probe (cache_check.py: standard library only, so quick to start) given a key it does not
    read writes a probe error naming the key, and runs nothing."""
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"triton_dir": None, "inductor_dir": None, "all_roots": "yes"}), encoding="utf-8")
    out = tmp_path / "result.json"
    argv = [sys.executable, str(ROOT / "probes" / "cache_check.py"), "--config", str(config), "--out", str(out)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    payload = json.loads(out.read_text(encoding="utf-8"))
    assert payload["probe_error"] == "ConfigError: probe config CacheCheckConfig.all_roots: expected bool, got str"
