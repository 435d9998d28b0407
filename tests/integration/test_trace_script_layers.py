"""A traced script's transformers models are listed layer by layer, as `--model` lists a preset: a
Qwen3.5 hybrid (three gated-DeltaNet layers, one full attention) built by a script in
tests/realworld, traced by the CLI in a child process and checked against ground truth taken
without dflashdoctor (tests/realworld/qwen35_hybrid_truth.py, another child process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

from dflashdoctor.fla_guards import fla_unusable_on
from tests.conftest import CliRun, run_cli
from tests.paths import ROOT

REALWORLD = ROOT / "tests" / "realworld"
SCRIPT = REALWORLD / "qwen35_hybrid_script.py"
# a script's device is its own: FLA's platform alone says whether its kernels can run here
fla_cannot_run = pytest.mark.skipif(
    not fla_unusable_on("cuda"), reason="needs fla-core installed where its kernels cannot run (a CPU machine)"
)


def _truth(*args: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, str(REALWORLD / "qwen35_hybrid_truth.py"), str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.fixture(scope="module")
def truth() -> dict[str, Any]:
    return _truth()


@pytest.fixture(scope="module")
def traced(tmp_path_factory) -> CliRun:
    """The script traced once, for the tests that read its report."""
    return run_cli(tmp_path_factory.mktemp("script"), "trace-attention", "--script", str(SCRIPT))


@pytest.fixture(scope="module")
def modeled(tmp_path_factory, truth) -> CliRun:
    """The script's model as `--model` builds it from its config (forward only, as the script runs it)."""
    folder = tmp_path_factory.mktemp("model")
    (folder / "config.json").write_text(json.dumps(truth["config"]))
    return run_cli(folder, "trace-attention", "--model", str(folder / "config.json"), "--no-backward")


def _layer_modules(truth: dict[str, Any]) -> list[str]:
    """The layer modules in layer order, from the model's own module tree."""
    modules = truth["modules"]
    found = modules["Qwen3_5GatedDeltaNet"] + modules["Qwen3_5Attention"]
    return sorted(found, key=lambda name: int(name.split(".")[2]))


def _measurements(run: CliRun) -> dict[str, Any]:
    return run.report["results"][0]["measurements"]


def test_a_hybrid_script_lists_every_layer_as_its_model_does(traced, truth, modeled):
    assert traced.code == 0, traced.stdout + traced.stderr
    assert not traced.findings("target-raised")
    layers = _measurements(traced)["script_layers"]
    assert [layer["module"] for layer in layers] == _layer_modules(truth)
    assert [layer["kind"] for layer in layers] == truth["layer_types"]
    deltanet = set(truth["modules"]["Qwen3_5GatedDeltaNet"])
    # one call of the gated delta rule per DeltaNet layer: FLA's kernel (on a GPU with FLA) or the torch code
    kernel = "chunk_gated_delta_rule" if "chunk_gated_delta_rule" in truth["calls"] else "torch_chunk_gated_delta_rule"
    assert truth["calls"] == {kernel: len(deltanet), "sdpa_attention_forward": 1}
    impl = "fla kernel" if kernel == "chunk_gated_delta_rule" else "torch fallback"
    for layer in layers:
        linear = layer["module"] in deltanet
        assert layer["class"] == ("Qwen3_5GatedDeltaNet" if linear else "Qwen3_5Attention")
        assert layer["impl"] == (impl if linear else "sdpa")
        assert layer["ran"] and layer["calls"] == 1
    table = {site["module"]: site for site in _measurements(traced)["call_sites"]}
    assert list(table) == [layer["module"] for layer in layers]
    assert all(table[layer["module"]]["impl"] == layer["impl"] for layer in layers)
    assert table["model.layers.0.linear_attn"]["via"] == f"module forward (Qwen3_5GatedDeltaNet): {impl}"
    summary = traced.check("script layers")["summary"]
    assert summary.endswith(f"(all ran): 3 linear_attention via {impl}, 1 full_attention via sdpa")
    assert modeled.code == 0, modeled.stdout + modeled.stderr
    assert _measurements(modeled)["layers"] == layers


@fla_cannot_run
def test_on_a_cpu_with_fla_installed_a_script_gets_the_diagnosis_of_a_preset(traced, modeled):
    """By hand the script fails inside FLA (its kernels cannot run on a CPU) with transformers before
    5.25, whose fallback wrapper sends CPU inputs to the torch path itself from 5.25 on; traced, FLA is
    kept out as for a preset, the layers run transformers' torch fallback, and the report says why."""
    from packaging.version import Version
    from transformers import __version__ as transformers_version

    plain = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=600)
    if Version(transformers_version) >= Version("5.25"):
        assert plain.returncode == 0 and "falling back to its reference PyTorch implementation" in plain.stderr
    else:
        assert plain.returncode != 0 and "RuntimeError: 0 active drivers" in plain.stderr
    assert traced.code == 0 and traced.check("script")["status"] == "pass"
    (unavailable,) = traced.findings("kernel-unavailable")
    assert unavailable["severity"] == "warning" and "This trace kept FLA from importing" in unavailable["detail"]
    (said,) = modeled.findings("kernel-unavailable")
    assert (said["title"], said["detail"], said["fix"]) == (
        unavailable["title"],
        unavailable["detail"],
        unavailable["fix"],
    )


@fla_cannot_run
def test_a_script_that_imports_fla_itself_is_told_what_happened(cli_here):
    run = cli_here("trace-attention", "--script", str(SCRIPT), "--", "--fla-ops")
    assert run.code == 0, run.stdout + run.stderr
    assert not run.findings("target-raised")
    (stopped,) = run.findings("kernel-unavailable")
    line = next(i for i, text in enumerate(SCRIPT.read_text().splitlines(), 1) if "from fla.ops" in text)
    assert (stopped["where"]["file"], stopped["where"]["line"]) == (str(SCRIPT), line)
    assert stopped["title"].startswith("The script imports FLA itself")
    assert "failed because this trace kept FLA from importing" in stopped["detail"]
    assert run.check("script")["status"] == "warn"


def test_a_compiled_hybrid_lists_its_layers_inside_the_graph_and_adds_no_graph_break(cli_here):
    truth = _truth("--compile", "aot_eager")
    run = cli_here("trace-attention", "--script", str(SCRIPT), "--", "--compile", "aot_eager")
    assert run.code == 0, run.stdout + run.stderr
    layers = _measurements(run)["script_layers"]
    assert [layer["module"] for layer in layers] == _layer_modules(truth)
    assert all(layer["ran"] and layer["calls"] == 0 for layer in layers)  # in a graph: no eager call
    for site in _measurements(run)["call_sites"]:
        assert site["via"].startswith("inside an outer compiled region (backend aot_eager)")
        assert site["compiled_into_graphs"] == 1
    assert _measurements(run)["graph_breaks"] == truth["graph_breaks"]


def test_run_lists_the_layers_of_the_models_a_program_builds(tmp_path):
    """`run` uses the same recorder. An FLA that does not load (a stub that raises on import) lets the
    program run here (on a CPU too), with transformers' torch fallback, as it would run unobserved."""
    stub = tmp_path / "site" / "fla"
    stub.mkdir(parents=True)
    (stub / "__init__.py").write_text('raise ImportError("fla left out of this test")\n')
    path = os.pathsep.join(p for p in (str(tmp_path / "site"), os.environ.get("PYTHONPATH")) if p)
    run = run_cli(tmp_path, "run", "--", sys.executable, str(SCRIPT), env={"PYTHONPATH": path})
    assert run.code == 0, run.stdout + run.stderr
    (section,) = [r for r in run.report["results"] if r["measurements"].get("call_sites")]
    rows = {site["module"]: site["impl"] for site in section["measurements"]["call_sites"]}
    assert rows == {
        "model.layers.0.linear_attn": "torch fallback",
        "model.layers.1.linear_attn": "torch fallback",
        "model.layers.2.linear_attn": "torch fallback",
        "model.layers.3.self_attn": "sdpa",
    }
    (layers,) = [c for c in section["checks"] if c["name"] == "script layers"]
    assert "4 attention layers in the models the script built (all ran)" in layers["summary"]


def test_the_recorder_lists_models_as_they_are_built_and_restores_everything():
    """In this process, tiny Qwen3 models (two layers): one built while recording is listed and hooked;
    the rows of another, freed before the end (a script's model freed as its function returns), are
    still listed; afterwards `post_init` is transformers' own again, no hook is left, and a model
    built then is not listed."""
    import gc
    import weakref

    from transformers import AutoModelForCausalLM, PreTrainedModel, Qwen3Config

    from dflashdoctor.hooks.flex_dense import DenseFlexRecorder
    from dflashdoctor.hooks.hf_attention import HFAttentionRecorder
    from dflashdoctor.hooks.module_names import ModuleNamer

    config = Qwen3Config(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        intermediate_size=64,
        vocab_size=64,
    )
    post_init = PreTrainedModel.post_init
    with HFAttentionRecorder(None, DenseFlexRecorder(), ModuleNamer()) as recorder:
        kept = AutoModelForCausalLM.from_config(config)
        freed = weakref.ref(AutoModelForCausalLM.from_config(config))
        gc.collect()
        attention = [m for m in kept.modules() if type(m).__name__ == "Qwen3Attention"]
        assert len(attention) == 2 and all(len(m._forward_hooks) == 1 for m in attention)
    assert freed() is None and PreTrainedModel.post_init is post_init
    assert all(not m._forward_hooks for m in attention)
    names = [f"model.layers.{i}.self_attn" for i in range(2)]
    rows = [(layer["module"], layer["kind"], layer["configured"], layer["ran"]) for layer in recorder.layers()]
    assert rows == [(name, "full_attention", "sdpa", False) for name in names * 2]
    AutoModelForCausalLM.from_config(config)
    assert len(recorder.layers()) == 4
