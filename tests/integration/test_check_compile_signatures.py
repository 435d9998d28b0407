"""check-compile on wrappers whose signatures are not flex_attention's: torchtune's real one, and
the other shapes real wrappers take. Each runs the real CLI in a child process (real torch.compile
and flex_attention; dynamo state cannot leak between tests), and the report says how the target
was called.
"""

from __future__ import annotations

import pytest

from dflashdoctor.call_plan import plan_call
from tests.paths import ROOT, TARGETS

TORCHTUNE = ROOT / "tests" / "realworld" / "torchtune_flex.py"
SIGNATURES = TARGETS / "signatures.py"
EXPANDED = "(no enable_gqa: K/V expanded 4x to 8 heads with repeat_interleave, as its callers must)"


def _call(run) -> dict:
    return run.report["results"][0]["measurements"]["call"]


def test_torchtunes_compile_friendly_flex_attention_passes(cli_here):
    """torchtune @ bd2a0fc's wrapper takes (q, k, v, block_mask): no enable_gqa, so K/V are expanded
    to the query heads as torchtune's MultiHeadAttention does; torch.compiler.disable around it is
    not mistaken for a compiled wrapper."""
    run = cli_here("check-compile", f"{TORCHTUNE}:compile_friendly_flex_attention", "--device", "cpu", "--vary", "2")
    assert run.code == 0, run.stdout + run.stderr
    assert run.check("target")["summary"] == (
        "compile_friendly_flex_attention calls the compiled wrapper `flex_attention_compiled`"
    )
    assert run.check("call") == {
        "name": "call",
        "status": "info",
        "summary": f"called as target(q, k, v, block_mask=...) {EXPANDED}",
        "codes": [],
    }
    call = _call(run)
    assert (call["mask"], call["mask_name"], call["enable_gqa"]) == ("keyword", "block_mask", None)
    assert call["expand_kv"] == 4
    assert run.check("forward")["status"] == "pass"
    assert run.check("numerics")["status"] == "pass"
    assert run.check("varying lengths")["status"] == "pass"
    assert "called as target(q, k, v, block_mask=...)" in run.stdout


@pytest.mark.parametrize(
    ("attr", "text"),
    [
        ("positional_block_mask", f"target(q, k, v, block_mask) {EXPANDED}"),
        ("mask_only", f"target(q, k, v, mask=...) {EXPANDED}"),
        ("extra_keywords", "target(q, k, v, block_mask=..., enable_gqa=True)"),
        ("compiled_module", f"target(q, k, v, attn_mask=...) {EXPANDED}"),  # its forward's signature
    ],
)
def test_wrapper_signatures_are_called_as_their_callers_call_them(cli_here, attr, text):
    run = cli_here("check-compile", f"{SIGNATURES}:{attr}", "--device", "cpu", "--vary", "0")
    assert run.code == 0, run.stdout + run.stderr
    assert run.check("call")["summary"] == f"called as {text}"
    assert _call(run)["text"] == text
    assert run.check("forward")["status"] == "pass"
    assert run.check("numerics")["status"] == "pass"


def test_healthy_reference_is_called_with_enable_gqa(cli_here):
    run = cli_here("check-compile", "--device", "cpu", "--vary", "0", "--json")
    assert run.code == 0, run.stdout + run.stderr
    assert _call(run)["text"] == "target(q, k, v, block_mask=..., enable_gqa=True)"


def test_a_required_parameter_it_cannot_fill_is_bad_input(cli_here):
    spec = f"{SIGNATURES}:needs_layer"
    run = cli_here("check-compile", spec, "--device", "cpu", "--vary", "0")
    assert run.code == 2, run.stdout + run.stderr
    assert run.stderr.splitlines() == [
        f"dflashdoctor: {spec} does not take flex_attention's call convention: its parameter `layer_idx` is "
        "required and check-compile cannot fill it (it passes query, key, value and block_mask); give "
        "`layer_idx` a default, or point check-compile at a wrapper that fills it"
    ]
    assert not run.report_dir.exists()


def test_expanded_kv_give_what_enable_gqa_gives(fresh_dynamo):
    """The expansion is the one GQA means (each K/V head serves the next `heads // kv_heads` query
    heads), checked against flex_attention's own enable_gqa, eager, in this process."""
    import torch
    from torch.nn.attention.flex_attention import flex_attention

    def torchtune_like(q, k, v, block_mask):
        return flex_attention(q, k, v, block_mask=block_mask)

    generator = torch.Generator().manual_seed(0)
    q = torch.randn(2, 8, 128, 16, generator=generator, dtype=torch.float64)
    k, v = (torch.randn(2, 2, 256, 16, generator=generator, dtype=torch.float64) for _ in range(2))
    plan = plan_call(torchtune_like, heads=8, kv_heads=2)
    assert plan.expand_kv == 4
    torch.testing.assert_close(plan.call(torchtune_like, q, k, v, None), flex_attention(q, k, v, enable_gqa=True))
