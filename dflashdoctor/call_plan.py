"""How check-compile calls a target: read from the target's signature, so real wrappers are called
the way their own callers call them.

flex_attention's convention is `target(query, key, value, block_mask=..., enable_gqa=...)`, but real
wrappers differ: torchtune's `compile_friendly_flex_attention(q, k, v, block_mask)` takes no
`enable_gqa` (its callers repeat K/V to the query heads first), others take the mask positionally,
as `mask` or `attn_mask`, add keyword arguments with defaults, or put `score_mod` fourth as
flex_attention itself does. Refusing them all would leave those users without a diagnosis, and
guessing without saying so would judge a call nobody makes; so the plan is made by inspection, and
it says what it passed.

Probed side, standard library only: it runs inside the user's interpreter. The tensors are only
touched through their own `repeat_interleave` method, so torch need not be imported here.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any

from dflashdoctor.records import CallPlanRecord

# Names under which wrappers take flex_attention's block_mask, most specific first; after them any
# other parameter whose name ends in "mask" (`mask_mod` ends in "mod": a function, not a mask).
MASK_NAMES = ("block_mask", "mask", "attn_mask", "attention_mask")
KEYWORD = "keyword"
POSITIONAL = "positional"

_POSITIONAL_KINDS = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
_KEYWORD_KINDS = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
_VARIADIC_KINDS = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)


class UnusableSignature(ValueError):
    """The target cannot be called with what check-compile has: the message names the parameter."""


@dataclass(frozen=True)
class CallPlan:
    """What check-compile passes to the target, and how.

    mask: KEYWORD (as `mask_name=`), POSITIONAL (after query, key, value and `defaults`), or None
    when the target takes no mask at all. `defaults` are positional parameters that stand between
    value and a positional mask (flex_attention's own `score_mod`): each is passed its own default.
    `enable_gqa` is passed only when the target takes it; otherwise, with more query than K/V heads,
    K and V are repeated `expand_kv` times along the head dimension first.
    """

    mask: str | None = KEYWORD
    mask_name: str = "block_mask"
    defaults: tuple[str, ...] = ()
    enable_gqa: bool | None = None  # the value passed; None: not passed
    expand_kv: int = 1
    heads: int = 1  # query heads, which expanded K/V reach
    signature: str | None = None  # what was inspected; None: nothing to inspect (a C callable)
    default_values: tuple[Any, ...] = field(default=(), compare=False, repr=False)

    def call(self, target: Any, query: Any, key: Any, value: Any, block_mask: Any) -> Any:
        """Calls `target` as planned; K/V are expanded inside the call, so the phase that times it
        pays for the copy as the wrapper's real callers do."""
        if self.expand_kv > 1:
            key = key.repeat_interleave(self.expand_kv, dim=1)
            value = value.repeat_interleave(self.expand_kv, dim=1)
        args: list[Any] = [query, key, value]
        kwargs: dict[str, Any] = {}
        if self.mask == POSITIONAL:
            args += [*self.default_values, block_mask]
        elif self.mask == KEYWORD:
            kwargs[self.mask_name] = block_mask
        if self.enable_gqa is not None:
            kwargs["enable_gqa"] = self.enable_gqa
        return target(*args, **kwargs)

    def text(self) -> str:
        """The call as a reader would write it, e.g. `target(q, k, v, block_mask=...)` and why."""
        parts = ["q", "k", "v"]
        if self.mask == POSITIONAL:
            parts += [f"<{name} default>" for name in self.defaults] + [self.mask_name]
        elif self.mask == KEYWORD:
            parts.append(f"{self.mask_name}=...")
        if self.enable_gqa is not None:
            parts.append(f"enable_gqa={self.enable_gqa}")
        notes = []
        if self.signature is None:
            notes.append("no signature to inspect: flex_attention's own convention")
        if self.mask is None:
            notes.append("it takes no mask, so none is passed")
        if self.expand_kv > 1:
            notes.append(
                f"no enable_gqa: K/V expanded {self.expand_kv}x to {self.heads} heads with repeat_interleave, "
                "as its callers must"
            )
        return f"target({', '.join(parts)})" + "".join(f" ({note})" for note in notes)

    def to_dict(self) -> CallPlanRecord:
        """What the report keeps: JSON only (the defaults' values are the target's, not ours)."""
        return {
            "text": self.text(),
            "signature": self.signature,
            "mask": self.mask,
            "mask_name": self.mask_name if self.mask else None,
            "defaults": list(self.defaults),
            "enable_gqa": self.enable_gqa,
            "expand_kv": self.expand_kv,
        }


_UNWRAP_STEPS = 4  # torch.compile(module) -> module -> forward, with room to spare


def _signature(target: Any) -> inspect.Signature | None:
    """The signature the arguments reach. A module's is `__call__(*args, **kwargs)`, so its
    `forward`'s is read instead, and a compiled module's (`_orig_mod`) module's. None for callables
    without one (builtins, some C extensions)."""
    try:
        signature = inspect.signature(target)
        for _ in range(_UNWRAP_STEPS):
            inner = getattr(target, "_orig_mod", None) or getattr(target, "forward", None)
            if [p.kind for p in signature.parameters.values()] != list(_VARIADIC_KINDS) or not callable(inner):
                break
            target = inner
            signature = inspect.signature(target)
        return signature
    except (TypeError, ValueError):
        return None


def _mask_parameter(candidates: list[inspect.Parameter]) -> inspect.Parameter | None:
    by_name = {p.name: p for p in candidates}
    for name in MASK_NAMES:
        if name in by_name:
            return by_name[name]
    return next((p for p in candidates if p.name.lower().endswith("mask")), None)


def _required(parameter: inspect.Parameter, passed: str) -> UnusableSignature:
    return UnusableSignature(
        f"its parameter `{parameter.name}` is required and check-compile cannot fill it (it passes "
        f"{passed}); give `{parameter.name}` a default, or point check-compile at a wrapper that fills it"
    )


def plan_call(target: Any, heads: int, kv_heads: int) -> CallPlan:
    """The call check-compile makes to `target` with `heads` query and `kv_heads` K/V heads.

    Raises UnusableSignature when query, key and value cannot go first and positionally, or when a
    required parameter is left that check-compile has nothing to pass to.
    """
    gqa = heads != kv_heads
    signature = _signature(target)
    if signature is None:  # nothing to read: flex_attention's convention, and the call will tell
        return CallPlan(enable_gqa=gqa, heads=heads)
    parameters = list(signature.parameters.values())
    positional = [p for p in parameters if p.kind in _POSITIONAL_KINDS]
    takes_args = any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in parameters)
    takes_kwargs = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)
    if len(positional) < 3 and not takes_args:
        raise UnusableSignature(f"query, key and value must go first, positionally, and it takes {signature}")
    rest = [p for p in parameters if p not in positional[:3] and p.kind not in _VARIADIC_KINDS]
    mask_parameter = _mask_parameter(rest)
    # **kwargs takes a keyword only where no parameter has its name: such a parameter got query, key
    # or value, or is positional-only, and the keyword would collide with it.
    named = {p.name: p for p in parameters if p.kind not in _VARIADIC_KINDS}
    mask, mask_name, between = _place_mask(
        mask_parameter, positional, takes_args, takes_kwargs and "block_mask" not in named
    )
    # A parameter named enable_gqa takes it by keyword, unless value went to it, it is given its
    # default before a positional mask, or it is positional-only.
    gqa_parameter = named.get("enable_gqa")
    if gqa_parameter is None:
        passes_gqa = takes_kwargs
    else:
        passes_gqa = gqa_parameter in rest and gqa_parameter not in between and gqa_parameter.kind in _KEYWORD_KINDS
    passed = ["query", "key", "value"] + ([mask_name] if mask else []) + (["enable_gqa"] if passes_gqa else [])
    for parameter in rest:  # those between value and a positional mask too: they get their default
        filled = parameter is mask_parameter or (parameter is gqa_parameter and passes_gqa)
        if not filled and parameter.default is inspect.Parameter.empty:
            raise _required(parameter, f"{', '.join(passed[:-1])} and {passed[-1]}")
    return CallPlan(
        mask=mask,
        mask_name=mask_name,
        defaults=tuple(p.name for p in between),
        default_values=tuple(p.default for p in between),
        enable_gqa=gqa if passes_gqa else None,
        expand_kv=1 if passes_gqa or not gqa else heads // kv_heads,
        heads=heads,
        signature=str(signature),
    )


def _place_mask(
    parameter: inspect.Parameter | None,
    positional: list[inspect.Parameter],
    takes_args: bool,
    kwargs_take_it: bool,
) -> tuple[str | None, str, list[inspect.Parameter]]:
    """How the mask goes in: (KEYWORD or POSITIONAL or None, the name it goes under, the positional
    parameters between value and a positional mask, which get their defaults).

    A named mask parameter goes by keyword unless it is positional-only; without one, `**kwargs`
    (`kwargs_take_it`) takes `block_mask=` (flex_attention's keyword, which a forwarding wrapper
    passes on), and a bare `*args` takes it after every named positional parameter.
    """
    if parameter is not None:
        if parameter.kind in _KEYWORD_KINDS:
            return KEYWORD, parameter.name, []
        return POSITIONAL, parameter.name, positional[3 : positional.index(parameter)]
    if kwargs_take_it:
        return KEYWORD, "block_mask", []
    if takes_args:
        return POSITIONAL, "block_mask", positional[3:]
    return None, "block_mask", []
