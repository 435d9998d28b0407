"""Names and scopes inside one file's tree, for the rules that follow a value or a call from one
function to another (lint/varying.py, lint/threads.py): which `def` a name or `self.name` means,
which nodes a function runs itself (not its nested functions'), what names an expression reads.

Only what one file says is followed: a function imported from elsewhere is never resolved, so a
rule built on these stays quiet rather than guess.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass, field

from dflashdoctor.hooks.rebinding import dotted_name

Function = ast.FunctionDef | ast.AsyncFunctionDef
NESTED = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)


def called_text(func: ast.expr, cls: str | None) -> str | None:
    """How facts.py names what a call calls: `self.attr`/`cls.attr` inside class C is `C.attr`, as a
    compiled wrapper bound to `self._compiled` is recorded as `C._compiled`."""
    text = dotted_name(func)
    if text is None or cls is None:
        return text
    head, _, rest = text.partition(".")
    return f"{cls}.{rest}" if head in ("self", "cls") and rest else text


def reads(node: ast.AST | None) -> set[str]:
    """The names an expression loads."""
    if node is None:
        return set()
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def stored(target: ast.AST) -> set[str]:
    """The names an assignment target binds (`a`, `a, b`, `(i, (x, y))`; not attributes)."""
    return {n.id for n in ast.walk(target) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}


def own_nodes(body: list[ast.stmt] | ast.AST) -> Iterator[ast.AST]:
    """Every node a block (a list of statements, or one node, which is entered) runs itself:
    nested functions, classes and lambdas are not entered (their bodies run when they are called,
    maybe never)."""
    stack: list[ast.AST]
    stack = [s for s in reversed(body) if not isinstance(s, NESTED)] if isinstance(body, list) else [body]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(reversed([c for c in ast.iter_child_nodes(node) if not isinstance(c, NESTED)]))


@dataclass
class Def:
    node: Function
    cls: str | None  # the class `self` means in it: a method's, inherited by closures in a method
    enclosing: tuple[Function, ...]  # the functions around it, outermost first

    @property
    def text(self) -> str:
        """How a call to it is spelled in facts.py's terms: `name` (a module-level function, or a
        closure called from its enclosing function), `Class.name` for a method."""
        return f"{self.cls}.{self.node.name}" if self.cls and not self.enclosing else self.node.name

    def params(self) -> set[str]:
        args = self.node.args
        every = [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]
        return {a.arg for a in every if a is not None} - {"self", "cls"}


@dataclass
class Index:
    """Every `def` of the file, and where each sits."""

    defs: list[Def] = field(default_factory=list)
    by_text: dict[str, Def] = field(default_factory=dict)  # module-level functions and methods
    nested: dict[tuple[int, str], Def] = field(default_factory=dict)  # (id of the enclosing def, name)

    def resolve(self, expr: ast.expr, cls: str | None, enclosing: tuple[Function, ...]) -> Def | None:
        """The `def` a callable expression names, where this file says: a closure of an enclosing
        function (innermost first), a module-level function, `self.method` of the class around it,
        or the first argument of `functools.partial`."""
        if isinstance(expr, ast.Call) and (dotted_name(expr.func) or "").split(".")[-1] == "partial" and expr.args:
            return self.resolve(expr.args[0], cls, enclosing)
        if isinstance(expr, ast.Name):
            for function in reversed(enclosing):
                found = self.nested.get((id(function), expr.id))
                if found is not None:
                    return found
            found = self.by_text.get(expr.id)
            return found if found is not None and found.cls is None else None
        text = called_text(expr, cls)
        return self.by_text.get(text) if text and text != dotted_name(expr) else None


@dataclass
class Survey:
    """One walk over a file's tree: its defs, every call with the class and functions around it,
    what each assignment or `with ... as` binds (named as calls spell it), the modules it imports."""

    index: Index = field(default_factory=Index)
    calls: list[tuple[ast.Call, str | None, tuple[Function, ...]]] = field(default_factory=list)
    bindings: list[tuple[set[str], ast.expr]] = field(default_factory=list)
    imports: set[str] = field(default_factory=set)  # top-level package names
    imported: set[str] = field(default_factory=set)  # the names imports bind (`np`, `dist_autograd`)

    def add(self, found: Def) -> None:
        self.index.defs.append(found)
        if found.enclosing:
            self.index.nested.setdefault((id(found.enclosing[-1]), found.node.name), found)
        else:
            self.index.by_text.setdefault(found.text, found)

    def note(self, node: ast.AST, cls: str | None, enclosing: tuple[Function, ...]) -> None:
        """Record a node that is neither a def nor a class."""
        if isinstance(node, ast.Call):
            self.calls.append((node, cls, enclosing))
        elif isinstance(node, ast.Assign):
            texts = {called_text(target, cls) for target in node.targets}
            self.bindings.append(({t for t in texts if t}, node.value))
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            self.bindings.append(({t for t in [called_text(node.target, cls)] if t}, node.value))
        elif isinstance(node, ast.With | ast.AsyncWith):
            for item in node.items:
                text = called_text(item.optional_vars, cls) if item.optional_vars is not None else None
                if text:
                    self.bindings.append(({text}, item.context_expr))
        elif isinstance(node, ast.Import):
            self.imports |= {alias.name.split(".")[0] for alias in node.names}
            self.imported |= {alias.asname or alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.module and not node.level:
                self.imports.add(node.module.split(".")[0])
            self.imported |= {alias.asname or alias.name for alias in node.names}


# Nodes with nothing a survey records below them: never pushed (about half of a tree's nodes).
_LEAVES: tuple[type[ast.AST], ...]
_LEAVES = (ast.Name, ast.Constant, ast.expr_context, ast.operator, ast.unaryop, ast.cmpop, ast.boolop, ast.alias)
_LEAVES += (ast.arguments,)


def survey(tree: ast.Module) -> Survey:
    """Walk the tree once, scope by scope, without recursion (a deeply nested file cannot exhaust
    the stack). Decorators and default values are not searched for calls."""
    found = Survey()
    scopes: list[tuple[list[ast.stmt], str | None, tuple[Function, ...]]] = [(tree.body, None, ())]
    while scopes:
        roots, cls, enclosing = scopes.pop()
        stack: list[ast.AST] = list(roots)
        while stack:
            node = stack.pop()
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                found.add(Def(node, cls, enclosing))
                scopes.append((node.body, cls, (*enclosing, node)))
                continue
            if isinstance(node, ast.ClassDef):
                scopes.append((node.body, node.name, ()))
                continue
            found.note(node, cls, enclosing)
            for name in node._fields:
                value = getattr(node, name, None)
                if isinstance(value, list):
                    stack.extend(v for v in value if isinstance(v, ast.AST) and not isinstance(v, _LEAVES))
                elif isinstance(value, ast.AST) and not isinstance(value, _LEAVES):
                    stack.append(value)
    return found


def index(tree: ast.Module) -> Index:
    return survey(tree).index
