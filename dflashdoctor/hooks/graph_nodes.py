"""Which layer a dense kernel belongs to when a compiled graph called it.

Under a backend that does not reach Inductor (`eager`, `aot_eager`), a whole model's graph calls
flex_attention's dense kernel from FX-generated code, one frame for every layer; the Python frames
above it are those of the compiled function (the model's outer forward), so they name no layer.
The graph itself does: the generated code's line maps to a node (`GraphModule._lineno_map`, the
map dynamo itself uses to carry node metadata across retracing), and dynamo stamps each node with
the module stack it was traced in (`nn_module_stack`: `L['self'].layers.1.self_attn` and the
class). AOTAutograd copies a forward node's stack to its backward nodes (`fwd_nn_module_stack`),
so a backward graph names its layer too, though no user frame is on the autograd thread.

The stack's path is relative to a local of the compiled frame (`L['self']`); it is resolved on the
frame that called the graph, so the name is the model's own dotted name. A backward has no such
frame: it takes the name its forward resolved for the same path.

Probed side: standard library and torch. Every attribute is read defensively: a torch that lays out
graphs differently gives no node, and the caller falls back to the frames.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from types import CodeType, FrameType
from typing import Any, NamedTuple

GENERATED = "<eval_with_key>"  # the file name FX gives the code it generates
_ROOT = re.compile(r"^(?P<scope>[LG])\['(?P<name>[^']+)'\](?P<rest>.*)$")
_ITEM = re.compile(r"\[(\d+)\]")


class GraphNode(NamedTuple):
    """The FX node a generated graph frame is executing, as the recorder needs it. A tuple: one is
    made per dense call (a frozen dataclass's init costs several times more)."""

    module_path: str  # as dynamo wrote it: `L['self'].layers.1.self_attn`
    module_class: str
    frame: FrameType  # the generated graph's frame: the frames above it hold the compiled function's locals


def node_of(frame: FrameType) -> GraphNode | None:
    """The module of the node that a generated FX graph's frame is executing, or None."""
    graph_module = frame.f_locals.get("self")
    lines = getattr(graph_module, "_lineno_map", None)
    graph = getattr(graph_module, "graph", None)
    forward = getattr(getattr(graph_module, "forward", None), "__code__", None)
    if not isinstance(lines, dict) or graph is None or forward is None:
        return None
    index = lines.get(frame.f_lineno - forward.co_firstlineno)
    if not isinstance(index, int):
        return None
    for position, node in enumerate(graph.nodes):
        if position == index:
            meta = getattr(node, "meta", {})
            stack = meta.get("nn_module_stack") or meta.get("fwd_nn_module_stack")
            return _innermost(stack, frame)
    return None


def _innermost(stack: Any, frame: FrameType) -> GraphNode | None:
    if not isinstance(stack, dict) or not stack:
        return None
    entry = list(stack.values())[-1]
    if not isinstance(entry, tuple) or len(entry) < 2 or not isinstance(entry[0], str):
        return None
    module_class = entry[1] if isinstance(entry[1], str) else getattr(entry[1], "__name__", str(entry[1]))
    return GraphNode(module_path=entry[0], module_class=module_class.rsplit(".", 1)[-1], frame=frame)


@functools.lru_cache(maxsize=256)
def _parsed(path: str) -> tuple[str, str, tuple[str, ...]] | None:
    """`L['self'].layers[1].self_attn` as (scope, root name, attribute path): read once per path."""
    match = _ROOT.match(path)
    if match is None:
        return None
    parts = tuple(part for part in _ITEM.sub(r".\1", match.group("rest")).split(".") if part)
    return match.group("scope"), match.group("name"), parts


def resolve_module(path: str, frame: FrameType | None, depth: int, compiled_scope: Callable[[CodeType], bool]) -> Any:
    """The module object at `path` (`L['self'].layers.1.self_attn`), read from the locals (or
    globals) of the compiled function's frame: the first frame above the graph whose code
    `compiled_scope` admits (not torch's, not generated) that holds the root name. None when none does."""
    parsed = _parsed(path)
    if parsed is None:
        return None
    scope, name, parts = parsed
    for _ in range(depth):
        if frame is None:
            return None
        if compiled_scope(frame.f_code):  # only then: reading f_locals builds a dict of every local
            space = frame.f_locals if scope == "L" else frame.f_globals
            if name in space:
                return _walk(space[name], parts)
        frame = frame.f_back
    return None


def _walk(root: Any, parts: tuple[str, ...]) -> Any:
    current = root
    for part in parts:
        children = getattr(current, "_modules", None)
        if isinstance(children, dict) and part in children:
            current = children[part]
        else:
            return None
    return current
