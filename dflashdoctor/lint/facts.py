"""What one Python file says about its flex_attention, read with `ast` alone: nothing is imported or
run, so a repository is scanned without torch installed and without executing the team's code.

Facts, not verdicts (lint/rules.py judges them):
- the names the file binds to torch's raw `flex_attention` and to `torch` itself;
- each `torch.compile(...)` call: what it compiles, its `backend` and `dynamic` when written as
  constants, and the name or attribute it is bound to (`Wrapper._compiled = torch.compile(...)`);
- each raw `flex_attention(...)` call, with the functions around it and whether one of them is
  compiled (`@torch.compile`) or excluded from compiling (`@torch.compiler.disable`);
- later assignments to a name or attribute that held a compiled wrapper (a rebinding);
- the functions passed as `score_mod`/`mask_mod` (or to `create_block_mask`) and the module-level
  numbers they read that some function rebinds with `global`.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field

_FLEX_MODULE = "torch.nn.attention.flex_attention"
_DISABLE = {"torch.compiler.disable", "torch._dynamo.disable"}
_MOD_KEYWORDS = {"score_mod", "mask_mod"}


@dataclass
class CompileCall:
    line: int
    compiled: str  # the expression compiled, as written
    compiles_flex: bool  # it is torch's raw flex_attention
    backend: str | None  # the backend written as a constant; None: left to Inductor, the default
    dynamic: bool | None
    bound_to: list[str] = field(default_factory=list)  # names or dotted attributes it is assigned to


@dataclass
class RawCall:
    line: int
    function: str | None  # the innermost enclosing function
    compiled_around: bool  # some enclosing function is compiled with @torch.compile
    disabled_around: bool


@dataclass
class Rebinding:
    line: int
    target: str
    value: str
    to_raw_flex: bool


@dataclass
class GlobalRead:
    line: int
    function: str
    name: str


@dataclass
class FileFacts:
    path: str
    compiles: list[CompileCall] = field(default_factory=list)
    raw_calls: list[RawCall] = field(default_factory=list)
    rebindings: list[Rebinding] = field(default_factory=list)
    global_reads: list[GlobalRead] = field(default_factory=list)


def _dotted(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return f"{base}.{node.attr}" if base else None
    return None


class _Collector(ast.NodeVisitor):
    def __init__(self, path: str) -> None:
        self.facts = FileFacts(path)
        self.flex_names: set[str] = set()  # names bound to the raw function
        self.flex_modules: set[str] = set()  # names bound to torch.nn.attention.flex_attention
        self.torch_names: set[str] = set()
        self.compile_names: set[str] = set()  # `from torch import compile`
        self.functions: list[tuple[str, bool, bool]] = []  # (name, compiled, disabled), outermost first
        self.classes: list[str] = []
        self.wrappers: dict[str, int] = {}  # target -> line where a compiled wrapper was bound
        self.mods: set[str] = set()  # functions passed as score_mod / mask_mod
        self.module_numbers: set[str] = set()  # module-level names assigned a number
        self.rebound_globals: set[str] = set()  # names some function declares `global` and assigns
        self.reads: list[GlobalRead] = []

    # bindings ------------------------------------------------------------------------------
    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if alias.name == "torch":
                self.torch_names.add(alias.asname or "torch")
            elif alias.name == _FLEX_MODULE and alias.asname:
                self.flex_modules.add(alias.asname)
            elif alias.name.startswith("torch.") and alias.asname is None:
                self.torch_names.add("torch")

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        for alias in node.names:
            if node.module == _FLEX_MODULE and alias.name == "flex_attention":
                self.flex_names.add(alias.asname or alias.name)
            elif node.module == "torch.nn.attention" and alias.name == "flex_attention":
                self.flex_modules.add(alias.asname or alias.name)
            elif node.module == "torch" and alias.name == "compile":
                self.compile_names.add(alias.asname or alias.name)

    def _is_flex(self, node: ast.expr) -> bool:
        if isinstance(node, ast.Name):
            return node.id in self.flex_names
        dotted = _dotted(node)
        if dotted is None or not dotted.endswith(".flex_attention"):
            return False
        base = dotted.rsplit(".", 1)[0]
        return base in self.flex_modules or any(base == f"{t}.nn.attention.flex_attention" for t in self.torch_names)

    def _is_compile(self, node: ast.expr) -> bool:
        dotted = _dotted(node)
        return dotted in self.compile_names or any(dotted == f"{t}.compile" for t in self.torch_names)

    def _decorator_kind(self, decorator: ast.expr) -> tuple[bool, bool]:
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        dotted = _dotted(target) or ""
        compiled = self._is_compile(target)
        disabled = any(dotted == name.replace("torch", t, 1) for t in self.torch_names for name in _DISABLE)
        return compiled, disabled

    # scopes --------------------------------------------------------------------------------
    def _function(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        kinds = [self._decorator_kind(d) for d in node.decorator_list]
        compiled = any(k[0] for k in kinds)
        disabled = any(k[1] for k in kinds)
        globals_here = {name for stmt in ast.walk(node) if isinstance(stmt, ast.Global) for name in stmt.names}
        self.rebound_globals |= globals_here
        self.functions.append((node.name, compiled, disabled))
        self.generic_visit(node)
        self.functions.pop()
        if not self.functions and not self.classes:
            self._reads_of(node)

    visit_FunctionDef = _function
    visit_AsyncFunctionDef = _function

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self.classes.append(node.name)
        self.generic_visit(node)
        self.classes.pop()

    def _reads_of(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        """Names a module-level function reads that it neither binds nor takes: globals."""
        local = {a.arg for a in (*node.args.args, *node.args.kwonlyargs, *node.args.posonlyargs)}
        local |= {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
        for n in ast.walk(node):
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and n.id not in local:
                self.reads.append(GlobalRead(n.lineno, node.name, n.id))

    # statements ----------------------------------------------------------------------------
    def _target_text(self, target: ast.expr) -> str | None:
        dotted = _dotted(target)
        if dotted is None:
            return None
        if self.classes and not self.functions and isinstance(target, ast.Name):
            return f"{self.classes[-1]}.{dotted}"  # a class attribute, as code elsewhere names it
        if dotted.startswith("self.") and self.classes:
            return f"{self.classes[-1]}.{dotted[5:]}"
        return dotted

    def visit_Assign(self, node: ast.Assign) -> None:
        self._assigned(node.targets, node.value, node.lineno)
        self.generic_visit(node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        if node.value is not None:
            self._assigned([node.target], node.value, node.lineno)
        self.generic_visit(node)

    def _assigned(self, targets: list[ast.expr], value: ast.expr, line: int) -> None:
        if not self.functions and not self.classes:
            for target in targets:
                number = isinstance(value, ast.Constant) and type(value.value) in (int, float)
                if isinstance(target, ast.Name) and number:
                    self.module_numbers.add(target.id)
        texts = [t for t in (self._target_text(target) for target in targets) if t]
        if isinstance(value, ast.Call) and self._is_compile(value.func):
            return  # bound by visit_Call's CompileCall
        placeholder = isinstance(value, ast.Constant) and value.value is None  # `_compiled = None`, filled later
        for text in texts:
            if text in self.wrappers and line > self.wrappers[text] and not placeholder:
                self.facts.rebindings.append(Rebinding(line, text, ast.unparse(value), self._is_flex(value)))

    def visit_Call(self, node: ast.Call) -> None:
        if self._is_compile(node.func) and node.args:
            self._compile_call(node)
        elif self._is_flex(node.func):
            self.facts.raw_calls.append(
                RawCall(
                    node.lineno,
                    self.functions[-1][0] if self.functions else None,
                    any(f[1] for f in self.functions),
                    any(f[2] for f in self.functions),
                )
            )
            if len(node.args) >= 4 and isinstance(node.args[3], ast.Name):
                self.mods.add(node.args[3].id)
        for keyword in node.keywords:
            if keyword.arg in _MOD_KEYWORDS and isinstance(keyword.value, ast.Name):
                self.mods.add(keyword.value.id)
        if (
            (_dotted(node.func) or "").endswith("create_block_mask")
            and node.args
            and isinstance(node.args[0], ast.Name)
        ):
            self.mods.add(node.args[0].id)
        self.generic_visit(node)

    def _compile_call(self, node: ast.Call) -> None:
        keywords = {k.arg: k.value for k in node.keywords if k.arg}
        backend = keywords.get("backend")
        dynamic = keywords.get("dynamic")
        call = CompileCall(
            line=node.lineno,
            compiled=ast.unparse(node.args[0]),
            compiles_flex=self._is_flex(node.args[0]),
            backend=backend.value if isinstance(backend, ast.Constant) and isinstance(backend.value, str) else None,
            dynamic=dynamic.value if isinstance(dynamic, ast.Constant) and isinstance(dynamic.value, bool) else None,
        )
        self.facts.compiles.append(call)

    def finish(self, tree: ast.Module) -> FileFacts:
        # Bind each compile call to what its statement assigns it to.
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign | ast.AnnAssign) and isinstance(node.value, ast.Call):
                for call in self.facts.compiles:
                    if call.line == node.value.lineno and self._is_compile(node.value.func):
                        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                        call.bound_to = [_dotted(t) or ast.unparse(t) for t in targets]
        self.facts.global_reads = [
            read
            for read in self.reads
            if read.function in self.mods and read.name in self.module_numbers and read.name in self.rebound_globals
        ]
        return self.facts


def file_facts(path: str, source: str) -> FileFacts:
    """The facts of one file; SyntaxError and ValueError (a NUL byte) propagate to the caller."""
    tree = ast.parse(source, filename=path)
    collector = _Collector(path)
    # Two passes: the first learns which targets hold compiled wrappers, the second finds them rebound.
    first = _Collector(path)
    first.visit(tree)
    for call in first.finish(tree).compiles:
        if call.compiles_flex:
            for target in bound_targets(tree, call.line):
                collector.wrappers[target] = call.line
    collector.visit(tree)
    return collector.finish(tree)


def bound_targets(tree: ast.Module, line: int, *, reachable_only: bool = False) -> list[str]:
    """The targets of the assignment on `line` as the second pass spells them (class attributes
    qualified by their class). `reachable_only`: those an import can reach (`module:name`,
    `module:Class.attr`), not a function's local or an instance's attribute."""
    found: list[str] = []

    def walk(node: ast.AST, classes: list[str], in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                walk(child, [*classes, child.name], in_function)
            elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                walk(child, classes, True)
            else:
                if isinstance(child, ast.Assign | ast.AnnAssign) and child.lineno == line:
                    targets = child.targets if isinstance(child, ast.Assign) else [child.target]
                    for target in targets:
                        dotted = _dotted(target)
                        if dotted is None:
                            continue
                        if classes and not in_function and isinstance(target, ast.Name):
                            dotted = f"{classes[-1]}.{dotted}"
                        elif dotted.startswith("self.") and classes:
                            if reachable_only:
                                continue
                            dotted = f"{classes[-1]}.{dotted[5:]}"
                        elif reachable_only and in_function:
                            continue
                        found.append(dotted)
                walk(child, classes, in_function)

    walk(tree, [], False)
    return found
