"""trace-attention on the CPU: tiny presets built from HF config classes, traced in a child process."""

from __future__ import annotations

import json

import pytest

from dflashdoctor.models import PRESETS
from tests.paths import TARGETS

SITE_FIELDS = {
    "file",
    "line",
    "function",
    "module",
    "origin",
    "via",
    "calls",
    "verdict",
    "dense_forward",
    "dense_backward",
}


def test_qwen27b_lists_every_layer_and_says_it_cannot_use_flex(cli_here):
    run = cli_here("trace-attention", "--model", "qwen27b", "--device", "cpu")
    assert run.code == 0, run.stdout + run.stderr
    measurements = run.report["results"][0]["measurements"]
    layers = measurements["layers"]
    assert len(layers) == 8
    full = [layer["module"] for layer in layers if layer["kind"] == "full_attention"]
    assert full == ["model.layers.3.self_attn", "model.layers.7.self_attn"]
    assert {layer["impl"] for layer in layers if layer["kind"] == "full_attention"} == {"sdpa"}
    linear = [layer for layer in layers if layer["kind"] == "linear_attention"]
    assert len(linear) == 6 and {layer["impl"] for layer in linear} == {"torch fallback"}  # no FLA here
    (unsupported,) = run.findings("flex-unsupported-model")
    assert "Qwen3_5ForCausalLM" in unsupported["title"]
    assert all(set(site) >= SITE_FIELDS for site in measurements["call_sites"])


def _fla_installed() -> bool:
    from dflashdoctor.fla_guards import fla_folder

    return fla_folder() is not None


def _layers_by_kind(layers: list[dict]) -> list[str]:
    return [layer["kind"] for layer in layers]


@pytest.mark.skipif(not _fla_installed(), reason="needs fla-core (the fla extra)")
def test_qwen27b_on_a_cpu_with_fla_installed(cli_here):
    """transformers binds FLA's kernels whenever FLA imports; on a CPU they cannot run. The trace runs
    those layers on transformers' torch fallback, says so, and lists every layer with what it ran."""
    run = cli_here("trace-attention", "--model", "qwen27b")
    assert run.code == 0, run.stdout + run.stderr
    layers = run.report["results"][0]["measurements"]["layers"]
    assert _layers_by_kind(layers) == ["linear_attention"] * 3 + ["full_attention"] + ["linear_attention"] * 3 + [
        "full_attention"
    ]
    assert all(layer["ran"] and layer["calls"] == 1 for layer in layers)
    assert {layer["impl"] for layer in layers if layer["kind"] == "linear_attention"} == {"torch fallback"}
    assert {layer["impl"] for layer in layers if layer["kind"] == "full_attention"} == {"sdpa"}
    table = {site["module"]: site for site in run.report["results"][0]["measurements"]["call_sites"]}
    assert list(table) == [layer["module"] for layer in layers]
    assert all(table[layer["module"]]["impl"] == layer["impl"] for layer in layers)
    assert table["model.layers.0.linear_attn"]["verdict"] == "not flex"
    assert table["model.layers.0.linear_attn"]["via"] == "module forward (Qwen3_5GatedDeltaNet): torch fallback"
    (unavailable,) = run.findings("kernel-unavailable")
    assert unavailable["severity"] == "warning" and "cannot run on the CPU" in unavailable["title"]
    assert run.findings("flex-unsupported-model") and not run.findings("target-raised")


def test_a_frozen_target_is_traced_forward_only_unless_backward_is_asked(cli_here):
    run = cli_here("trace-attention", "--model", "qwen27b")
    assert run.code == 0, run.stdout + run.stderr
    assert run.report["results"][0]["measurements"]["backward"] is False
    assert "forward only (a frozen target: as in DFlash training)" in run.check("model")["summary"]
    asked = cli_here("trace-attention", "--model", "qwen27b", "--backward")
    assert asked.code == 0, asked.stdout + asked.stderr
    assert asked.report["results"][0]["measurements"]["backward"] is True


_TAIL = ("linear_attention", "full_attention")


def test_a_model_step_that_raises_mid_way_still_lists_every_layer(cli_here, tmp_path):
    """A real model whose third layer fails (a linear-attention layer with a convolution of width 0):
    the two layers before it ran, and every layer is still in the table, as configured."""
    preset = PRESETS["qwen27b"]
    config = {"model_type": preset.model_type, **preset.full, **preset.tiny} | {
        "num_hidden_layers": 6,
        "linear_conv_kernel_dim": 0,
        "layer_types": ["full_attention", "full_attention", "linear_attention", "full_attention", *_TAIL],
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    run = cli_here("trace-attention", "--model", str(path))
    assert run.code == 1 and run.findings("target-raised")
    layers = run.report["results"][0]["measurements"]["layers"]
    assert [layer["module"] for layer in layers] == [
        f"model.layers.{i}.{'linear_attn' if kind == 'linear_attention' else 'self_attn'}"
        for i, kind in enumerate(config["layer_types"])
    ]
    assert [layer["ran"] for layer in layers] == [True, True, False, False, False, False]
    table = run.report["results"][0]["measurements"]["call_sites"]
    assert [site["module"] for site in table] == [layer["module"] for layer in layers]
    assert [site["calls"] for site in table] == [1, 1, 0, 0, 0, 0]
    assert all(site["verdict"].startswith("did not run") for site in table[2:])
    assert "2 ran before the step stopped" in run.check("layers")["summary"]


def test_flex_capable_model_shows_hf_flex_sites_fused(cli_here):
    run = cli_here("trace-attention", "--model", "qwen3", "--device", "cpu")
    assert run.code == 0, run.stdout + run.stderr
    sites = run.report["results"][0]["measurements"]["call_sites"]
    assert [s["module"] for s in sites] == [f"model.layers.{i}.self_attn" for i in range(4)]
    for site in sites:
        assert (site["impl"], site["verdict"], site["origin"]) == ("flex_attention", "fused", "transformers")
        assert site["file"].endswith("modeling_qwen3.py") and site["function"] == "forward"
        assert site["mask"] == "BlockMask" and site["mask_sparsity_pct"] is not None
    (hf,) = run.findings("hf-internal-flex-path")
    assert hf["evidence"]["modules"] == [s["module"] for s in sites]
    assert "repeat-kv-expansion" not in run.codes()  # 16 query heads: a power of two


def test_dynamo_disabled_makes_hf_flex_dense_per_module(cli_here):
    run = cli_here("trace-attention", "--model", "qwen3", "--device", "cpu", env={"TORCHDYNAMO_DISABLE": "1"})
    assert run.code == 1
    dense = run.findings("dense-forward")
    assert [f["where"]["module"] for f in dense] == [f"model.layers.{i}.self_attn" for i in range(4)]
    assert run.check("flex calls")["status"] == "fail"


def test_non_power_of_two_heads_repeat_kv(cli_here, tmp_path):
    config = {
        "model_type": "qwen3",
        "hidden_size": 96,
        "num_hidden_layers": 2,
        "num_attention_heads": 6,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "intermediate_size": 128,
        "vocab_size": 512,
    }
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text(json.dumps(config))
    run = cli_here("trace-attention", "--model", str(tmp_path / "model"), "--device", "cpu")
    assert run.code == 0, run.stdout + run.stderr
    (repeat,) = run.findings("repeat-kv-expansion")
    assert "3x" in repeat["title"] and repeat["evidence"]["modules"] == [
        "model.layers.0.self_attn",
        "model.layers.1.self_attn",
    ]


@pytest.mark.parametrize(
    ("model", "message"),
    [
        ("gpt5", "unknown model preset 'gpt5'; known presets: qwen27b, qwen27b-dflash, qwen3, llama"),
        ("missing/config.json", "cannot read model config missing/config.json"),
    ],
)
def test_bad_model_exits_2(cli_here, model, message):
    run = cli_here("trace-attention", "--model", model)
    assert run.code == 2
    assert message in run.stderr
    assert len(run.stderr.strip().splitlines()) == 1


def test_invalid_config_json_exits_2(cli_here, tmp_path):
    bad = tmp_path / "config.json"
    bad.write_text("{not json")
    run = cli_here("trace-attention", "--model", str(bad))
    assert run.code == 2
    assert "is not valid JSON: line 1" in run.stderr


SCRIPT = TARGETS / "hf_script.py"
HF_SITES = ["model.layers.0.self_attn", "model.layers.1.self_attn"]


def _sites(run) -> dict[str, dict]:
    return {s["module"]: s for s in run.report["results"][0]["measurements"]["call_sites"]}


def test_script_shows_hf_path_and_own_wrapper_as_separate_sites(cli_here):
    run = cli_here("trace-attention", "--script", str(SCRIPT))
    assert run.code == 0, run.stdout + run.stderr
    sites = _sites(run)
    assert sorted(sites) == sorted([*HF_SITES, "attn"])
    for name in HF_SITES:
        assert (sites[name]["origin"], sites[name]["verdict"]) == ("transformers", "fused")
        assert "HF's compiled singleton" in sites[name]["via"]
    own = sites["attn"]
    assert (own["origin"], own["verdict"], own["function"]) == ("user code", "fused", "forward")
    assert own["file"] == str(SCRIPT)
    assert own["wrapper_names"] == [f"{SCRIPT}:compiled_flex"]
    assert "user compiled wrapper" in own["via"]


def test_expect_wrapper_names_the_modules_that_bypass_it(cli_here):
    run = cli_here("trace-attention", "--script", str(SCRIPT), "--expect-wrapper", f"{SCRIPT}:compiled_flex")
    assert run.code == 1
    (bypass,) = run.findings("bypasses-wrapper")
    assert sorted(s["module"] for s in bypass["evidence"]["sites"]) == HF_SITES
    assert run.check("expected wrapper")["summary"].startswith("1 of 3 flex sites")


def test_raw_call_in_script_is_dense_at_its_line(cli_here):
    run = cli_here("trace-attention", "--script", str(SCRIPT), "--", "--raw")
    assert run.code == 1
    (dense,) = run.findings("dense-forward")
    assert dense["where"]["module"] == "attn" and dense["where"]["file"] == str(SCRIPT)
    assert _sites(run)["attn"]["via"] == "raw flex_attention (not compiled)"


def test_script_that_raises_keeps_the_sites_seen(cli_here):
    run = cli_here("trace-attention", "--script", str(SCRIPT), "--", "--fail")
    assert run.code == 1
    (raised,) = run.findings("target-raised")
    assert "loss went NaN" in raised["detail"] and "Traceback" in raised["evidence"]["traceback"]
    assert len(_sites(run)) == 3


def test_missing_script_exits_2(cli_here):
    run = cli_here("trace-attention", "--script", "no_such_script.py")
    assert run.code == 2
    assert run.stderr.strip() == "dflashdoctor: no such script: no_such_script.py"


DRAFTER_SITES = [f"layers.{i}.self_attn" for i in range(5)]
DRAFTER_WRAPPER = "dflashdoctor.reference.drafter:_compiled_flex_attention"


def _drafter_sites(run) -> list[dict]:
    return [s for s in run.report["results"][0]["measurements"]["call_sites"] if s["module"] in DRAFTER_SITES]


def test_drafter_step_runs_every_flex_call_through_the_user_wrapper(cli_here):
    run = cli_here("trace-attention", "--model", "qwen27b", "--drafter", "--expect-wrapper", DRAFTER_WRAPPER)
    assert run.code == 0, run.stdout + run.stderr
    sites = _drafter_sites(run)
    assert [s["module"] for s in sites] == DRAFTER_SITES
    for site in sites:
        assert site["verdict"] == "fused"
        assert DRAFTER_WRAPPER in site["wrapper_names"]
        assert site["mask"] == "BlockMask" and 0 <= site["mask_sparsity_pct"] <= 100
    assert run.check("expected wrapper")["status"] == "pass"
    assert "flex-unsupported-model" in run.codes()  # the target still cannot use flex


def test_drafter_on_hf_flex_path_bypasses_the_wrapper(cli_here):
    # Drafter alone: transformers is imported for this fault only, and must be bound before the
    # flex recorder all the same.
    run = cli_here(
        "trace-attention",
        "--drafter",
        "--drafter-fault",
        "hf-flex-path",
        "--expect-wrapper",
        DRAFTER_WRAPPER,
    )
    assert run.code == 1
    (bypass,) = run.findings("bypasses-wrapper")
    assert [s["module"] for s in bypass["evidence"]["sites"]] == DRAFTER_SITES
    assert all("HF's compiled singleton" in s["via"] for s in bypass["evidence"]["sites"])


def test_drafter_eager_wrapper_is_dense_despite_compile(cli_here):
    run = cli_here("trace-attention", "--model", "qwen27b", "--drafter", "--drafter-fault", "eager-wrapper")
    assert run.code == 1
    dense = run.findings("dense-forward")
    assert [f["where"]["module"] for f in dense] == DRAFTER_SITES
    assert all(s["verdict"] == "dense despite compile" and "backend eager" in s["via"] for s in _drafter_sites(run))


def test_drafter_fault_needs_drafter(cli_here):
    run = cli_here("trace-attention", "--drafter-fault", "eager-wrapper")
    assert run.code == 2
    assert run.stderr.strip() == "dflashdoctor: --drafter-fault needs --drafter"


BLOCK_SCRIPT = TARGETS / "compiled_block_script.py"


def test_call_inside_a_compiled_module_is_a_site_and_adds_no_graph_break(cli_here):
    run = cli_here("trace-attention", "--script", str(BLOCK_SCRIPT))
    assert run.code == 0, run.stdout + run.stderr
    assert run.report["results"][0]["measurements"]["graph_breaks"] == 0
    assert run.check("graph breaks")["status"] == "pass"
    (site,) = _sites(run).values()
    assert (site["module"], site["function"], site["line"], site["file"]) == ("Block", "forward", 16, str(BLOCK_SCRIPT))
    assert site["via"].startswith("inside an outer compiled region (backend inductor)")
    assert (site["verdict"], site["calls"], site["compiled_into_graphs"]) == ("fused", 0, 1)
    assert site["q_shape"] == [1, 2, 64, 16]


def test_outer_region_with_eager_backend_is_dense_at_the_call_inside(cli_here):
    run = cli_here("trace-attention", "--script", str(BLOCK_SCRIPT), "--", "--eager-backend")
    assert run.code == 1
    (dense,) = run.findings("dense-forward")
    assert (dense["where"]["module"], dense["where"]["line"]) == ("Block", 16)
    assert dense["evidence"]["verdict"] == "dense despite compile"
    assert dense["evidence"]["cause_kind"] == "model-backend" and "torch.compile(Block" in dense["fix"]
    assert "backend='eager'" in dense["fix"] and "does not help" in dense["fix"]
    assert dense["evidence"]["dense_forward"] == 2  # two calls at run time, one graph


def test_calls_inside_compiled_models_keep_their_module_names(cli_here):
    run = cli_here("trace-attention", "--script", str(SCRIPT), "--", "--compile-models")
    assert run.code == 0, run.stdout + run.stderr
    sites = _sites(run)
    assert sorted(sites) == sorted([*HF_SITES, "attn"])  # no `_orig_mod.` from torch.compile's wrapper
    for site in sites.values():
        assert site["via"].startswith("inside an outer compiled region (backend inductor)")
        assert site["verdict"] == "fused" and site["compiled_into_graphs"] == 1
    assert sites["attn"]["wrapper_names"] == [f"{SCRIPT}:compiled_flex"]
    # transformers' own warnings break this model's graph; nothing else may (the recorders add none).
    breaks = run.report["results"][0]["measurements"]["graph_break_reasons"]
    assert all("_warnings.warn" in reason for reason in breaks), breaks


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--scale", "huge"], "unknown scale 'huge'; expected auto, tiny, full"),
        (["--device", "tpu"], "unknown device 'tpu'; expected one of auto, cpu, cuda"),
        (["--steps", "0"], "--steps must be a whole number from 1 to 1000000, not 0"),
        (["--seq-len", "0"], "--seq-len must be a whole number from 1 to 2147483647, not 0"),
        (["--expect-wrapper", "nocolon"], "--expect-wrapper 'nocolon' is not of the form module:attr or file.py:attr"),
    ],
)
def test_bad_options_exit_2(cli_here, args, message):
    run = cli_here("trace-attention", *args)
    assert run.code == 2
    assert run.stderr.strip() == f"dflashdoctor: {message}"


def test_an_fla_that_does_not_load_is_named_and_the_layers_fall_back(cli_here, tmp_path):
    """A broken FLA install (its utils fail to import, as with a triton built for another CUDA): the
    trace still runs every layer, on transformers' torch code, and says why FLA's kernels did not."""
    package = tmp_path / "site" / "fla"
    (package / "utils").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "utils" / "__init__.py").write_text('raise ImportError("libtriton.so: cannot open shared object")\n')
    run = cli_here("trace-attention", "--model", "qwen27b", env={"PYTHONPATH": str(tmp_path / "site")})
    assert run.code == 0, run.stdout + run.stderr
    layers = run.report["results"][0]["measurements"]["layers"]
    assert {layer["impl"] for layer in layers if layer["kind"] == "linear_attention"} == {"torch fallback"}
    (unavailable,) = run.findings("kernel-unavailable")
    assert "FLA does not load here (ImportError: libtriton.so" in unavailable["detail"]
    assert "Repair the FLA install" in unavailable["fix"]


def test_a_script_in_another_declared_encoding_is_traced_and_its_line_quoted(cli_here, tmp_path):
    """`# -*- coding: latin-1 -*-` is Python: the probe reads the script as bytes, as the interpreter
    does (it opened it as UTF-8 and crashed), and the fix quotes the compile line as written."""
    script = tmp_path / "latin.py"
    script.write_bytes(
        b"# -*- coding: latin-1 -*-\n"
        b"import torch\n"
        b"from torch.nn.attention.flex_attention import flex_attention\n"
        b"class A(torch.nn.Module):\n"
        b"    def forward(self, q):\n"
        b"        return flex_attention(q, q, q)\n"
        b'm = torch.compile(A(), backend="aot_eager")  # caf\xe9\n'
        b"with torch.no_grad():\n"
        b"    m(torch.randn(1, 2, 128, 16))\n"
    )
    run = cli_here("trace-attention", "--script", str(script))
    assert run.code == 1, run.stdout + run.stderr
    (found,) = run.findings("dense-forward")
    assert "# caf\u00e9" in found["fix"] and "backend='aot_eager'" in found["fix"]
    assert "latin.py:7" in found["detail"]
