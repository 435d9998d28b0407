"""check-compile's call plan: real wrapper signatures are read, and the call made is the one planned.

The targets here are plain Python functions with the signatures real wrappers have; each call is
recorded by binding it to that signature, so what a test sees is what Python would pass.
"""

from __future__ import annotations

import inspect
import json
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from dflashdoctor.call_plan import KEYWORD, POSITIONAL, CallPlan, UnusableSignature, plan_call
from tests.unit.recorded import found, judged, raw

Q, K, V, MASK = "q", "k", "v", "the-block-mask"


def _arguments(target: Any, plan: CallPlan) -> tuple[tuple[Any, ...], dict[str, Any]]:
    seen: list[tuple[tuple[Any, ...], dict[str, Any]]] = []

    def record(*args: Any, **kwargs: Any) -> None:
        inspect.signature(target).bind(*args, **kwargs)  # a TypeError here is a call Python refuses
        seen.append((args, kwargs))

    plan.call(record, Q, K, V, MASK)
    return seen[0]


def _passed(target: Any, plan: CallPlan) -> dict[str, Any]:
    args, kwargs = _arguments(target, plan)
    return dict(inspect.signature(target).bind(*args, **kwargs).arguments)


def flex_like(query, key, value, score_mod=None, block_mask=None, scale=None, enable_gqa=False, *, return_aux=None):
    """flex_attention's own signature: score_mod is the fourth positional."""


def torchtune_like(q, k, v, block_mask):
    """torchtune's compile_friendly_flex_attention: no enable_gqa, no scale."""


def positional_only(q, k, v, block_mask, /):
    pass


def mask_only(q, k, v, mask):
    pass


def keyword_only_attn_mask(q, k, v, *, attn_mask=None, dropout_p=0.0):
    pass


def suffix_mask(q, k, v, doc_mask=None, window=None):
    pass


def mask_mod_only(q, k, v, mask_mod=None):
    """A mask_mod is a function, not a mask: nothing here takes the BlockMask."""


def score_mod_before_positional_mask(q, k, v, score_mod=None, block_mask=None, /):
    pass


def forwarding(*args, **kwargs):
    pass


def args_only(*args):
    pass


def needs_layer(query, key, value, block_mask, layer_idx):
    pass


def needs_scale_before_mask(q, k, v, scale, block_mask, /):
    pass


def two_tensors(query, key):
    pass


class AttentionModule:
    """An nn.Module's shape: `__call__(*args, **kwargs)` hands everything to `forward`."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.forward(*args, **kwargs)

    def forward(self, q, k, v, attn_mask=None):
        pass


def test_flex_attention_own_signature_gets_keywords_and_enable_gqa():
    plan = plan_call(flex_like, heads=8, kv_heads=2)
    assert (plan.mask, plan.mask_name, plan.enable_gqa, plan.expand_kv) == (KEYWORD, "block_mask", True, 1)
    assert _passed(flex_like, plan) == {"query": Q, "key": K, "value": V, "block_mask": MASK, "enable_gqa": True}
    assert plan.text() == "target(q, k, v, block_mask=..., enable_gqa=True)"


def test_without_gqa_heads_enable_gqa_is_false_where_taken():
    assert plan_call(flex_like, heads=8, kv_heads=8).enable_gqa is False


def test_torchtune_wrapper_takes_no_enable_gqa_so_kv_are_expanded():
    plan = plan_call(torchtune_like, heads=8, kv_heads=2)
    assert (plan.mask, plan.enable_gqa, plan.expand_kv) == (KEYWORD, None, 4)
    assert plan.text() == (
        "target(q, k, v, block_mask=...) "
        "(no enable_gqa: K/V expanded 4x to 8 heads with repeat_interleave, as its callers must)"
    )


def test_torchtune_wrapper_without_gqa_heads_needs_no_expansion():
    plan = plan_call(torchtune_like, heads=8, kv_heads=8)
    assert plan.expand_kv == 1
    assert _passed(torchtune_like, plan) == {"q": Q, "k": K, "v": V, "block_mask": MASK}
    assert plan.text() == "target(q, k, v, block_mask=...)"


def test_positional_only_mask_goes_fourth():
    plan = plan_call(positional_only, heads=4, kv_heads=4)
    assert plan.mask == POSITIONAL
    assert _arguments(positional_only, plan) == ((Q, K, V, MASK), {})
    assert plan.text() == "target(q, k, v, block_mask)"


def test_mask_under_another_name():
    assert _passed(mask_only, plan_call(mask_only, 4, 4))["mask"] == MASK
    plan = plan_call(keyword_only_attn_mask, 4, 4)
    assert _passed(keyword_only_attn_mask, plan)["attn_mask"] == MASK
    assert plan.text() == "target(q, k, v, attn_mask=...)"
    assert _passed(suffix_mask, plan_call(suffix_mask, 4, 4))["doc_mask"] == MASK


def test_a_mask_mod_parameter_is_not_given_the_mask():
    plan = plan_call(mask_mod_only, heads=4, kv_heads=4)
    assert plan.mask is None
    assert _arguments(mask_mod_only, plan) == ((Q, K, V), {})
    assert plan.text() == "target(q, k, v) (it takes no mask, so none is passed)"


def test_positional_mask_after_score_mod_passes_score_mods_default():
    plan = plan_call(score_mod_before_positional_mask, heads=4, kv_heads=4)
    assert plan.defaults == ("score_mod",)
    assert _arguments(score_mod_before_positional_mask, plan) == ((Q, K, V, None, MASK), {})
    assert plan.text() == "target(q, k, v, <score_mod default>, block_mask)"


def test_kwargs_take_flex_attentions_keywords():
    plan = plan_call(forwarding, heads=8, kv_heads=2)
    assert _arguments(forwarding, plan) == ((Q, K, V), {"block_mask": MASK, "enable_gqa": True})


def test_bare_args_take_the_mask_fourth_and_no_enable_gqa():
    assert _arguments(args_only, plan_call(args_only, heads=4, kv_heads=4)) == ((Q, K, V, MASK), {})
    assert plan_call(args_only, heads=8, kv_heads=2).expand_kv == 4


class CompiledModule:
    """torch.compile(module)'s shape: `__call__(*args, **kwargs)` around the module in `_orig_mod`."""

    def __init__(self, module: AttentionModule) -> None:
        self._orig_mod = module

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._orig_mod(*args, **kwargs)


@pytest.mark.parametrize("target", [AttentionModule(), CompiledModule(AttentionModule())], ids=["module", "compiled"])
def test_a_module_is_planned_from_its_forward(target):
    plan = plan_call(target, heads=4, kv_heads=4)
    assert (plan.mask_name, plan.enable_gqa) == ("attn_mask", None)
    assert plan.signature == "(q, k, v, attn_mask=None)"


def test_a_callable_without_signature_keeps_flex_attentions_convention():
    plan = plan_call(max, heads=8, kv_heads=2)  # max has no signature inspect can read
    assert plan.signature is None
    assert plan.text() == (
        "target(q, k, v, block_mask=..., enable_gqa=True) (no signature to inspect: flex_attention's own convention)"
    )


@pytest.mark.parametrize(
    ("target", "named"),
    [(needs_layer, "`layer_idx`"), (needs_scale_before_mask, "`scale`"), (two_tensors, "query, key and value")],
)
def test_what_cannot_be_filled_is_one_line_naming_it(target, named):
    with pytest.raises(UnusableSignature) as raised:
        plan_call(target, heads=8, kv_heads=2)
    message = str(raised.value)
    assert named in message
    assert "\n" not in message


def test_the_plan_reported_is_json():
    plan = plan_call(score_mod_before_positional_mask, heads=8, kv_heads=2)
    kept = json.loads(json.dumps(plan.to_dict()))
    assert kept == {
        "text": plan.text(),
        "signature": "(q, k, v, score_mod=None, block_mask=None, /)",
        "mask": "positional",
        "mask_name": "block_mask",
        "defaults": ["score_mod"],
        "enable_gqa": None,
        "expand_kv": 4,
    }


# -- the report ----------------------------------------------------------------------------------
def _planned(recording: str, plan: CallPlan) -> dict[str, Any]:
    """A recorded run's target, as a probe that planned its calls with `plan` reports it."""
    return {**raw(recording)["target"], "call": plan.to_dict()}


def test_the_report_says_how_the_target_was_called():
    plan = plan_call(torchtune_like, heads=8, kv_heads=2)
    (section,) = judged("cpu/check-compile-healthy", target=_planned("cpu/check-compile-healthy", plan))
    (call,) = [c for c in section.checks if c.name == "call"]
    assert (call.status, call.summary) == ("info", f"called as {plan.text()}")
    assert section.measurements["call"] == plan.to_dict()
    assert section.status == "pass"


def test_a_target_that_raised_says_how_it_was_called():
    plan = plan_call(mask_only, heads=8, kv_heads=2)
    results = judged("cpu/check-compile-raises", target=_planned("cpu/check-compile-raises", plan))
    (call,) = [c for r in results for c in r.checks if c.name == "call"]
    assert call.status == "fail"
    assert call.summary.endswith(f"; called as {plan.text()}")
    (raised,) = found(results, "target-raised")
    assert f"(it was called as {plan.text()})" in raised.detail


# -- odd signatures ------------------------------------------------------------------------------
_NAMES = ("q", "k", "v", "block_mask", "mask", "attn_mask", "doc_mask", "mask_mod", "score_mod", "scale", "enable_gqa")
_KINDS = (
    inspect.Parameter.POSITIONAL_ONLY,
    inspect.Parameter.POSITIONAL_OR_KEYWORD,
    inspect.Parameter.VAR_POSITIONAL,
    inspect.Parameter.KEYWORD_ONLY,
    inspect.Parameter.VAR_KEYWORD,
)


@st.composite
def signatures(draw: st.DrawFn) -> inspect.Signature:
    """Any signature Python accepts over names real wrappers use, in any kinds, with or without defaults."""
    names = draw(st.lists(st.sampled_from(_NAMES), unique=True, max_size=7))
    parameters = []
    for name in names:
        kind = draw(st.sampled_from(_KINDS))
        default = draw(st.sampled_from([inspect.Parameter.empty, None, 0.5]))
        if kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
            default = inspect.Parameter.empty
        parameters.append(inspect.Parameter(name, kind, default=default))
    parameters.sort(key=lambda p: p.kind)
    try:
        return inspect.Signature(parameters)
    except ValueError:  # two *args, a required parameter after a default: Python refuses it too
        assume(False)
        raise


class Signed:
    """A callable that has exactly the drawn signature (inspect reads `__signature__`)."""

    def __init__(self, signature: inspect.Signature) -> None:
        self.__signature__ = signature

    def __call__(self, *args: Any, **kwargs: Any) -> inspect.BoundArguments:
        return self.__signature__.bind(*args, **kwargs)


def _refused_in_one_line(refused: UnusableSignature, signature: inspect.Signature) -> bool:
    message = str(refused)
    named = "query, key and value" in message or any(f"`{name}`" in message for name in signature.parameters)
    return named and "\n" not in message


@settings(max_examples=400, deadline=None)
@given(signatures())
def test_any_signature_is_either_called_as_planned_or_refused_in_one_line(signature):
    """Without GQA heads nothing is expanded: the plan's call is bound to the signature for real."""
    target = Signed(signature)
    try:
        plan = plan_call(target, heads=4, kv_heads=4)
    except UnusableSignature as refused:
        assert _refused_in_one_line(refused, signature)
        return
    args, kwargs = _arguments(target, plan)  # a TypeError here: the plan made a call Python refuses
    values = [*args, *kwargs.values()]
    assert values[:3] == [Q, K, V]
    assert (MASK in values) == (plan.mask is not None)
    assert plan.expand_kv == 1
    assert kwargs.get("enable_gqa") is plan.enable_gqa  # False where taken, else not passed


@settings(max_examples=400, deadline=None)
@given(signatures())
def test_gqa_heads_reach_the_target_one_way_only(signature):
    """With 8 query and 2 K/V heads the target gets enable_gqa=True or K/V expanded 4x, never both
    and never neither."""
    try:
        plan = plan_call(Signed(signature), heads=8, kv_heads=2)
    except UnusableSignature as refused:
        assert _refused_in_one_line(refused, signature)
        return
    assert (plan.enable_gqa, plan.expand_kv) in ((True, 1), (None, 4))
    if plan.enable_gqa:  # nothing to expand: the call itself is bound to the signature
        assert _arguments(Signed(signature), plan)[1]["enable_gqa"] is True
    parameters = signature.parameters.values()
    if any(p.name == "enable_gqa" and p.kind is inspect.Parameter.KEYWORD_ONLY for p in parameters):
        assert plan.enable_gqa is True
    if not any(p.name == "enable_gqa" or p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        assert plan.expand_kv == 4
