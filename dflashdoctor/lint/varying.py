"""Where a flex_attention wrapper compiled with `dynamic=False` is called with a length that changes
from one call to the next, found in one file's tree.

Under `dynamic=False` dynamo compiles one graph per shape; once a wrapper has seen more lengths than
its recompile limit (8 by default) every later length runs flex_attention's dense kernel. Whether
lengths vary is usually only known at run time, so this stays conservative and fires on what the
source itself shows changing: a call to the wrapper (or to a function of the file that passes its
own arguments on to it) inside a loop or a comprehension, with a tensor whose size the loop
changes. A size changes when an expression that gives a tensor its size (the sizes passed to
`torch.randn`/`zeros`/..., `.view`/`.reshape`/`.expand`, `.narrow`'s length, `F.pad`'s padding, a
slice bound of which only one end moves) reads the loop's variable or a name computed from it in the
loop (`n = len(batch)`, `n = batch.shape[1]`), or when the tensor is drawn from a list built with
such sizes. A loop over batches that are simply passed on (`for batch in loader: wrapper(batch)`)
proves nothing and is left alone.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from dflashdoctor.hooks.rebinding import dotted_name
from dflashdoctor.lint.scopes import Def, called_text, index, own_nodes, reads, stored

_SIZED_BY_ALL = {"randn", "rand", "zeros", "ones", "empty", "view", "reshape", "expand", "repeat", "unflatten"}
_SIZED_BY_ALL |= {"new_zeros", "new_ones", "new_empty"}
_SIZED_BY_FIRST = {"full", "new_full"}
_SIZED_BY_LAST = {"randint", "narrow"}  # randint(low, high, size), narrow(dim, start, length)
_COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)
_ROUNDS = 4  # forwarders of forwarders followed this deep; names propagated this many times


@dataclass
class VaryingCall:
    wrapper: str  # the wrapper as facts.py names it
    line: int  # the call whose length varies
    called: str  # what that call calls: the wrapper, or a function that passes its arguments on to it
    loop_line: int


def _name(func: ast.expr) -> str:
    return (dotted_name(func) or "").rsplit(".", 1)[-1]


def _moving_bounds(lower: ast.expr | None, upper: ast.expr | None, moving: set[str]) -> list[ast.expr]:
    """The bound whose move changes a range's width: a window whose two ends move together
    (`x[i * c:(i + 1) * c]`) keeps its size."""
    ends = [end for end in (lower, upper) if end is not None]
    moved = [end for end in ends if reads(end) & moving]
    return moved if len(moved) == 1 else []


def _sizes(node: ast.AST, moving: set[str]) -> Iterator[ast.expr]:
    """The expressions inside `node` that give a tensor its size and read a moving name."""
    for sub in ast.walk(node):
        if isinstance(sub, ast.Slice):
            yield from _moving_bounds(sub.lower, sub.upper, moving)
        elif isinstance(sub, ast.Call):
            yield from (e for e in _size_arguments(sub) if reads(e) & moving)
            if _name(sub.func) == "arange" and len(sub.args) >= 2:
                yield from _moving_bounds(sub.args[0], sub.args[1], moving)


def _size_arguments(call: ast.Call) -> list[ast.expr]:
    """The arguments of a call that are a tensor's sizes, by the name of what it calls (a name
    alone: `torch.randn`, `x.new_zeros` and a user's own `randn` are alike, which only matters
    when a loop's variable is passed to it)."""
    name, args = _name(call.func), [a for a in call.args if not isinstance(a, ast.Starred)]
    keyword = [k.value for k in call.keywords if k.arg == "size"]
    if name in _SIZED_BY_ALL:
        return args + keyword
    if name in _SIZED_BY_FIRST:
        return args[:1] + keyword
    if name in _SIZED_BY_LAST or (name == "arange" and len(args) == 1):
        return args[-1:] + keyword
    if name == "pad" and len(args) >= 2:
        return [args[1]] + [k.value for k in call.keywords if k.arg == "pad"]
    return []


def _assignments(block: list[ast.stmt] | ast.AST) -> list[tuple[set[str], ast.expr]]:
    """(names bound, the expression they are bound from) for each binding a block runs itself."""
    found = []
    for node in own_nodes(block):
        if isinstance(node, ast.Assign):
            found.append((set().union(*(stored(t) for t in node.targets)), node.value))
        elif isinstance(node, ast.AnnAssign | ast.AugAssign | ast.NamedExpr) and node.value is not None:
            found.append((stored(node.target), node.value))
        elif isinstance(node, ast.For | ast.AsyncFor | ast.comprehension):
            found.append((stored(node.target), node.iter))
        elif isinstance(node, ast.With | ast.AsyncWith):
            found += [(stored(i.optional_vars), i.context_expr) for i in node.items if i.optional_vars]
    return found


_Binding = tuple[set[str], ast.expr]


def _spread(names: set[str], bindings: list[_Binding], reaches: Callable[[ast.expr, set[str]], bool]) -> set[str]:
    """`names` grown by every binding whose expression `reaches` them, until nothing changes."""
    grown = set(names)
    for _ in range(_ROUNDS):
        before = len(grown)
        for targets, value in bindings:
            if reaches(value, grown):
                grown |= targets
        if len(grown) == before:
            break
    return grown


def _seeds(loop: ast.For | ast.AsyncFor | ast.While) -> set[str]:
    """The names a loop changes on each turn: a for loop's variables; in a while loop the names it
    rebinds from themselves (`n += 16`, `n = n * 2`)."""
    if not isinstance(loop, ast.While):
        return stored(loop.target)
    return {n for targets, value in _assignments(loop.body) for n in targets if n in reads(value)} | {
        n for node in own_nodes(loop.body) if isinstance(node, ast.AugAssign) for n in stored(node.target)
    }


class _Scope:
    """One function's body (or the module's): the lists it builds with varying sizes, and each loop
    in it with the calls of interest inside."""

    def __init__(self, body: list[ast.stmt], targets: dict[str, str], cls: str | None) -> None:
        self.body, self.targets, self.cls = body, targets, cls
        bindings = _assignments(body)
        self.ragged = {n for names, value in bindings if self._ragged_collection(value) for n in names}

    @staticmethod
    def _ragged_collection(value: ast.expr) -> bool:
        """A comprehension whose elements are sized by its own variable: tensors of many lengths."""
        if not isinstance(value, _COMPREHENSIONS):
            return False
        moving = set().union(*(stored(g.target) for g in value.generators))
        element = value.value if isinstance(value, ast.DictComp) else value.elt
        return any(True for _ in _sizes(element, moving))

    def varying_calls(self) -> Iterator[VaryingCall]:
        """Each loop and comprehension of the body, nested ones too (a call in two loops is found
        in each; the caller keeps one)."""
        for node in own_nodes(self.body):
            if isinstance(node, ast.For | ast.AsyncFor | ast.While):
                yield from self._in_loop(node, _seeds(node), node.body, node.lineno)
            elif isinstance(node, _COMPREHENSIONS):
                moving = set().union(*(stored(g.target) for g in node.generators))
                yield from self._in_loop(node, moving, node, node.lineno)

    def _in_loop(
        self, loop: ast.AST, seeds: set[str], block: list[ast.stmt] | ast.AST, line: int
    ) -> Iterator[VaryingCall]:
        """The calls of interest in one loop (or comprehension) whose arguments' sizes it changes."""
        bindings = _assignments(block)
        moving = _spread(seeds, bindings, lambda value, names: bool(reads(value) & names))
        drawn = {n for target, source in _draws(loop) if reads(source) & self.ragged for n in stored(target)}
        sized = _spread(drawn, bindings, lambda value, names: self._sized(value, moving, names))
        for node in own_nodes(block):
            if not isinstance(node, ast.Call):
                continue
            text = called_text(node.func, self.cls)
            if text in self.targets and any(self._sized(a, moving, sized) for a in _arguments(node)):
                yield VaryingCall(self.targets[text], node.lineno, text, line)

    @staticmethod
    def _sized(value: ast.expr, moving: set[str], sized: set[str]) -> bool:
        """Whether an expression is (or is made from) a tensor whose size the loop changes."""
        return bool(reads(value) & sized) or any(True for _ in _sizes(value, moving))


def _draws(loop: ast.AST) -> list[tuple[ast.expr, ast.expr]]:
    """(target, what it iterates) of a for loop or each of a comprehension's generators."""
    if isinstance(loop, ast.For | ast.AsyncFor):
        return [(loop.target, loop.iter)]
    return [(g.target, g.iter) for g in getattr(loop, "generators", [])]


def _arguments(call: ast.Call) -> list[ast.expr]:
    return [*call.args, *(k.value for k in call.keywords)]


def _forwarders(defs: list[Def], wrappers: dict[str, str]) -> dict[str, str]:
    """Calls that reach a wrapper: the wrappers themselves, and each function of the file that
    passes its own parameters on to one (`def attention(q, k, v): return wrapper(q, k, v)`)."""
    targets = dict(wrappers)
    for _ in range(_ROUNDS):
        before = len(targets)
        for found in defs:
            if found.text in targets:
                continue
            params = found.params()
            for node in own_nodes(found.node.body):
                if not isinstance(node, ast.Call):
                    continue
                text = called_text(node.func, found.cls)
                if text in targets and any(reads(a) & params for a in _arguments(node)):
                    targets[found.text] = targets[text]
                    break
        if len(targets) == before:
            break
    return targets


def varying_calls(tree: ast.Module, wrappers: dict[str, str]) -> list[VaryingCall]:
    """Each call, in this file, of a static wrapper (`wrappers`: how a call spells it -> the wrapper's
    name) with a length that varies, in source order."""
    defs = index(tree).defs
    targets = _forwarders(defs, wrappers)
    found = {call.line: call for call in _Scope(tree.body, targets, None).varying_calls()}
    for function in defs:
        for call in _Scope(function.node.body, targets, function.cls).varying_calls():
            found.setdefault(call.line, call)  # a call in nested loops: the outer loop's first
    return [found[line] for line in sorted(found)]
