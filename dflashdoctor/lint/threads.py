"""Model steps and Triton kernels started on threads, found in one file's tree.

A Triton (or FLA) autotuner keeps per-call state on one shared instance: two threads inside it at
once corrupt each other (the runtime finding is `concurrent-autotuner-entry`). Threads that run a
model, a training step or a kernel launch each enter those autotuners. Torch's own source starts
threads for many harmless things, so this fires only where the file itself shows the whole path: a
thread started here (`ThreadPoolExecutor(...).submit/map(fn, ...)`, a `ThreadPool`'s map,
`threading.Thread(target=fn)`) on a function defined in this file (module-level, a closure, a
method through `self.`, under `functools.partial`, a lambda), which itself, or through functions of
this file it calls, runs something that looks like a step: `kernel[grid](...)` in a file that
imports triton, `.backward()`, `optimizer.step()` (a receiver named for an optimizer), a call of
something named `...model` (or its `forward`/`generate`), or a call of a wrapper this file compiles.
A step run under a lock (`with lock:`, a name bound to `threading.Lock()`) is the fix, not a fault.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass

from dflashdoctor.hooks.rebinding import dotted_name
from dflashdoctor.lint.scopes import NESTED, Def, Function, Index, called_text, survey

_POOLS = {"ThreadPoolExecutor", "ThreadPool"}
_POOL_CALLS = {"submit", "map", "imap", "imap_unordered", "starmap", "apply", "apply_async", "map_async"}
_LOCKS = {"Lock", "RLock", "Semaphore", "BoundedSemaphore"}
_MODEL_VERBS: tuple[str, ...]
_MODEL_VERBS = ("load", "build", "get", "create", "make", "init", "save", "download", "prepare", "set", "wrap")
_MODEL_VERBS += ("compile", "export", "convert", "register", "is_", "has_", "to_", "from_")
_DEPTH = 3  # functions of the file followed from the thread's target, this many calls deep
# A file can fire only if it makes a thread (`Thread(`, a `ThreadPoolExecutor` or `ThreadPool`) and
# holds a word of a step: `.backward()`, an optimizer's `.step()`, a `...model`/`...Model` call, a
# triton launch, a wrapper made by torch.compile.
_THREAD_WORDS = (b"Thread(", b"ThreadPool")
_STEP_WORDS = (b"backward", b".step(", b"odel", b"triton", b"compile")


def may_thread_a_step(data: bytes) -> bool:
    """Whether a file's bytes hold what the rule needs (substring tests: the rest is not parsed)."""
    return any(w in data for w in _THREAD_WORDS) and any(w in data for w in _STEP_WORDS)


@dataclass
class ThreadedCall:
    line: int  # where the thread is started
    how: str  # "ThreadPoolExecutor.submit", "threading.Thread", ...
    target: str  # the function the thread runs, as written
    step_line: int  # the call that looks like a model or kernel step
    step: str  # what it is, in words
    via: list[str]  # the functions of this file between the target and the step


def _is_model(name: str) -> bool:
    """`model`, `self.draft_model`: a module called; not `load_model()`, `build_model()`, nor a
    class made (`DraftModel(config)`)."""
    lowered = name.lower()
    return lowered.endswith("model") and not lowered.startswith(_MODEL_VERBS) and not name[:1].isupper()


def _last(node: ast.expr) -> str:
    return (dotted_name(node) or "").rsplit(".", 1)[-1]


class _File:
    """What the rule needs to know about the whole file (one walk, scopes.survey): its defs, its
    pools, locks and compiled names, the modules it imports (triton among them)."""

    def __init__(self, tree: ast.Module) -> None:
        found = survey(tree)
        self.index: Index = found.index
        self.calls = found.calls
        self.modules, self.imported = found.imports, found.imported
        self.pools: set[str] = set()
        self.locks: set[str] = set()
        self.compiled: set[str] = {d.text for d in found.index.defs if any(map(_compiles, d.node.decorator_list))}
        for names, value in found.bindings:
            if not isinstance(value, ast.Call):
                continue
            if _last(value.func) in _POOLS:
                self.pools |= names
            elif _last(value.func) in _LOCKS:
                self.locks |= names
            elif _compiles(value.func) or (isinstance(value.func, ast.Call) and _compiles(value.func.func)):
                self.compiled |= names

    def started(self, call: ast.Call, cls: str | None) -> tuple[str, ast.expr] | None:
        """(how, the target expression) when this call starts a thread on a function."""
        func = call.func
        if dotted_name(func) in ("Thread", "threading.Thread"):
            target = next((k.value for k in call.keywords if k.arg == "target"), None)
            target = target if target is not None or len(call.args) < 2 else call.args[1]
            return ("threading.Thread", target) if target is not None else None
        if not (isinstance(func, ast.Attribute) and func.attr in _POOL_CALLS and call.args):
            return None
        pool = func.value
        inline = isinstance(pool, ast.Call) and _last(pool.func) in _POOLS
        if not (inline or called_text(pool, cls) in self.pools):
            return None
        kind = _last(pool.func) if isinstance(pool, ast.Call) else "ThreadPoolExecutor"
        return f"{kind}.{func.attr}", call.args[0]

    def step(self, call: ast.Call, cls: str | None) -> str | None:
        """What a call is, in words, when it looks like a model or kernel step. A function of an
        imported module (`dist_autograd.backward(...)`, in torch's own RPC tests) is not counted:
        only a tensor's `.backward()` is."""
        func = call.func
        if isinstance(func, ast.Subscript) and "triton" in self.modules:
            return f"a Triton kernel launch `{dotted_name(func.value) or ast.unparse(func.value)}[grid](...)`"
        text = called_text(func, cls) or ""
        receiver, _, name = text.rpartition(".")
        if name == "backward" and receiver and not self._module(receiver):
            return f"`{text}()`, a backward pass"
        if name == "step" and "optim" in receiver.lower():
            return f"`{text}()`, an optimizer step"
        if _is_model(name) or (name in ("forward", "generate") and _is_model(receiver.rpartition(".")[2])):
            return f"`{text}(...)`, a model call"
        if text in self.compiled:
            return f"`{text}(...)`, a compiled wrapper"
        return None

    def _module(self, receiver: str) -> bool:
        return receiver.split(".")[0] in self.imported

    def locked(self, node: ast.With | ast.AsyncWith, cls: str | None) -> bool:
        for item in node.items:
            text = called_text(item.context_expr, cls) or ""
            if "lock" in text.lower() or text in self.locks:
                return True
        return False


def _compiles(node: ast.expr) -> bool:
    """`torch.compile` (or `compile` imported from torch), called or used as a decorator."""
    target = node.func if isinstance(node, ast.Call) else node
    return dotted_name(target) in ("torch.compile", "compile")


def _unlocked_calls(body: list[ast.stmt] | ast.expr, file: _File, cls: str | None) -> Iterator[ast.Call]:
    """The calls a function body runs itself, outside any `with lock:`."""
    stack: list[ast.AST] = (
        [s for s in reversed(body) if not isinstance(s, NESTED)] if isinstance(body, list) else [body]
    )
    while stack:
        node = stack.pop()
        if isinstance(node, ast.With | ast.AsyncWith) and file.locked(node, cls):
            continue
        if isinstance(node, ast.Call):
            yield node
        stack.extend(reversed([c for c in ast.iter_child_nodes(node) if not isinstance(c, NESTED)]))


def _find_step(
    body: list[ast.stmt] | ast.expr, cls: str | None, around: tuple[Function, ...], file: _File, depth: int
) -> tuple[ast.Call, str, list[str]] | None:
    """The first call in `body` (or in a function of the file it calls) that looks like a step."""
    callees = []
    for call in _unlocked_calls(body, file, cls):
        said = file.step(call, cls)
        if said is not None:
            return call, said, []
        callee = file.index.resolve(call.func, cls, around)
        if callee is not None:
            callees.append(callee)
    if depth <= 0:
        return None
    for callee in callees:
        found = _find_step(callee.node.body, callee.cls, (*callee.enclosing, callee.node), file, depth - 1)
        if found is not None:
            return found[0], found[1], [callee.node.name, *found[2]]
    return None


_Target = tuple[list[ast.stmt] | ast.expr, str | None, tuple[Function, ...], str]


def _target(expr: ast.expr, cls: str | None, around: tuple[Function, ...], file: _File) -> _Target | None:
    """(body, class, functions around it, its name) of the function a thread runs, if this file has it."""
    if isinstance(expr, ast.Lambda):
        return expr.body, cls, around, "a lambda"
    found: Def | None = file.index.resolve(expr, cls, around)
    if found is None:
        return None
    return found.node.body, found.cls, (*found.enclosing, found.node), ast.unparse(expr)


def threaded_calls(tree: ast.Module) -> list[ThreadedCall]:
    """Each thread this file starts on a function of its own that runs a model or kernel step."""
    file = _File(tree)
    found = []
    for call, cls, around in file.calls:
        start = file.started(call, cls)
        if start is None:
            continue
        target = _target(start[1], cls, around, file)
        if target is None:
            continue
        body, target_cls, target_around, name = target
        step = _find_step(body, target_cls, target_around, file, _DEPTH)
        if step is not None:
            found.append(ThreadedCall(call.lineno, start[0], name, step[0].lineno, step[1], step[2]))
    return sorted(found, key=lambda t: t.line)
