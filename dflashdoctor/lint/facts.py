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
  numbers they read that some function rebinds with `global`;
- the wrappers compiled with `dynamic=False` (`torch.compile(flex_attention, dynamic=False)`, of a
  `functools.partial` of it, `torch.compile(dynamic=False)(flex_attention)`, a function decorated
  `@torch.compile(dynamic=False)` that calls it) and the calls of each whose length varies
  (lint/varying.py);
- the threads started on a function of the file that runs a model or kernel step (lint/threads.py).
Both last analyses walk the tree again, so they run only in a file where the first pass saw a static
wrapper or a thread being made.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from typing import TypeGuard

from dflashdoctor.hooks.rebinding import dotted_name
from dflashdoctor.lint.parsing import parse_source
from dflashdoctor.lint.scopes import called_text
from dflashdoctor.lint.threads import ThreadedCall, threaded_calls
from dflashdoctor.lint.varying import VaryingCall, varying_calls

_FLEX_MODULE = "torch.nn.attention.flex_attention"
_DISABLE = {"torch.compiler.disable", "torch._dynamo.disable"}
_MOD_KEYWORDS = {"score_mod", "mask_mod"}
_THREAD_WORDS = {"Thread", "ThreadPoolExecutor", "ThreadPool"}
# A name that reads as a compile switch (`args.compile`, `use_compile`, `compile_flex`, `COMPILE`).
_COMPILE_SWITCH = re.compile(r"compile", re.IGNORECASE)
# A name that reads as a model or a part of one, as code compiling it whole spells it: its last word
# (`model`, `self.draft_model`, `transformer_block`, `layer`; not `create_block_mask`).
_MODEL_WORD = re.compile(
    r"(?:^|[._])(?:model|module|net|network|block|layer|encoder|decoder|transformer|drafter|policy|backbone|self)s?$",
    re.IGNORECASE,
)


@dataclass
class CompileCall:
    line: int
    compiled: str  # the expression compiled, as written
    compiles_flex: bool  # it is torch's raw flex_attention
    backend: str | None  # the backend written as a constant; None: left to Inductor, the default
    dynamic: bool | None
    bound_to: list[str] = field(default_factory=list)  # names or dotted attributes it is assigned to
    reachable: list[str] = field(default_factory=list)  # of those, what an import reaches (`name`, `Class.attr`)
    in_function: bool = False  # made inside a function: a re-compile of a wrapper defined elsewhere, or a helper's


@dataclass
class RawCall:
    line: int
    function: str | None  # the innermost enclosing function
    compiled_around: bool  # some enclosing function is compiled with @torch.compile
    disabled_around: bool
    column: int = 1
    enclosing: tuple[str, ...] = ()  # the functions around it, outermost first
    cls: str | None = None  # the class whose method (or a function in it) holds the call
    called_as: str = "flex_attention"  # the callee as written
    switch_line: int | None = None  # an `if` on a compile switch around it (`if not args.compile:`)
    alias_line: int | None = None  # called through a local bound to flex_attention on this line
    compiled_by: str | None = None  # what compiles it, found in this file (finish)
    beside_compiled: bool = False  # its function also calls a compiled flex_attention wrapper (finish)


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
class StaticWrapper:
    """A flex_attention wrapper compiled with dynamic=False, and how calls spell it."""

    line: int  # the torch.compile call, or the decorator
    name: str  # as the finding names it
    called_as: list[str]  # `name`, `Class.attr` (self.attr inside the class)


@dataclass
class StaticVarying:
    """A static wrapper called with a length that varies: the first such call, and how many."""

    line: int  # the wrapper's compile, where the fix goes
    wrapper: str
    call_line: int
    called: str  # the wrapper, or the function of the file that passes its arguments on to it
    loop_line: int
    calls: int


@dataclass
class CompileSites:
    """What one file compiles besides flex_attention itself, for the files it may reach: the
    functions and methods handed to torch.compile (`torch.compile(fn)`, `torch.compile(self.step)`:
    by their last name), and models compiled whole (`torch.compile(model)`, `block.compile()`,
    `aot_compile`, `torch.export.export`), each with its line."""

    functions: dict[str, int] = field(default_factory=dict)
    models: list[int] = field(default_factory=list)
    decorators: set[str] = field(default_factory=set)  # functions that compile the function they are given
    decorated: list[tuple[int, str, str]] = field(default_factory=list)  # (line, function, decorator's name)


@dataclass
class FileFacts:
    path: str
    relative: str = ""  # the path inside its project, which says whether it is a test (lint sets it)
    compiles: list[CompileCall] = field(default_factory=list)
    raw_calls: list[RawCall] = field(default_factory=list)
    rebindings: list[Rebinding] = field(default_factory=list)
    global_reads: list[GlobalRead] = field(default_factory=list)
    static_varying: list[StaticVarying] = field(default_factory=list)
    threaded: list[ThreadedCall] = field(default_factory=list)
    compile_sites: CompileSites = field(default_factory=CompileSites)
    called_in_methods: set[str] = field(default_factory=set)  # plain names a class's methods call
    raw_assignments: list[tuple[int, str]] = field(default_factory=list)  # (line, `a.B.attr`) = flex_attention
    registered_attention: set[str] = field(default_factory=set)  # functions registered as an attention kernel
    forwarded_wrappers: list[tuple[int, str]] = field(default_factory=list)  # (compile line, `Class.attr`)
    functions: dict[str, tuple[int, int, frozenset[str]]] = field(default_factory=dict)  # top-level def ->
    # (its line, how many positional parameters, the names its body reads)


class _Collector(ast.NodeVisitor):
    def __init__(self, path: str) -> None:
        self.facts = FileFacts(path)
        self.flex_names: set[str] = set()  # names bound to the raw function
        self.flex_modules: set[str] = set()  # names bound to torch.nn.attention.flex_attention
        self.torch_names: set[str] = set()
        self.compile_names: set[str] = set()  # `from torch import compile`
        self.functions: list[tuple[str, bool, bool]] = []  # (name, compiled, disabled), outermost first
        self.static_functions: list[tuple[int, str] | None] = []  # per function: (line, called as) if static
        self.classes: list[str] = []
        self.mods: set[str] = set()  # functions passed as score_mod / mask_mod
        self.module_numbers: set[str] = set()  # module-level names assigned a number
        self.rebound_globals: set[str] = set()  # names some function declares `global` and assigns
        self.top_functions: dict[str, ast.FunctionDef | ast.AsyncFunctionDef] = {}
        self.bindings: dict[int, tuple[list[str], list[str]]] = {}  # line -> (targets, reachable ones)
        self.assignments: list[tuple[int, list[str], ast.expr]] = []
        self.bound_in_function: set[int] = set()  # lines of compile calls bound inside a function
        self.aliases: dict[tuple[str, ...], dict[str, tuple[int, int | None]]] = {}  # scope -> local -> line
        self.factories: set[str] = set()  # top-level functions that return torch.compile(flex_attention)
        self.factory_calls: list[tuple[int, str, list[str]]] = []  # (line, factory called, module-level targets)
        self.call_targets: dict[int, list[str]] = {}  # id of a call assigned somewhere -> the targets' texts
        self.static: dict[int, StaticWrapper] = {}  # the compile's (or decorator's) line -> wrapper
        self.makes_threads = False
        self.switches: list[int] = []  # the lines of the `if`s on a compile switch around this node
        self.compiled_flex_names: dict[str, int] = {}  # `flex_attention = torch.compile(flex_attention)`
        self.calls_by_scope: dict[tuple[str, ...], set[str]] = {}  # (class, functions...) -> callees
        self.call_scopes: dict[int, tuple[str, ...]] = {}  # id of a RawCall -> its scope

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
        dotted = dotted_name(node)
        if dotted is None or not dotted.endswith(".flex_attention"):
            return False
        base = dotted.rsplit(".", 1)[0]
        return base in self.flex_modules or any(base == f"{t}.nn.attention.flex_attention" for t in self.torch_names)

    def _is_compile(self, node: ast.expr) -> bool:
        dotted = dotted_name(node)
        return dotted in self.compile_names or any(dotted == f"{t}.compile" for t in self.torch_names)

    def _is_partial(self, node: ast.expr) -> TypeGuard[ast.Call]:
        return (
            isinstance(node, ast.Call)
            and (dotted_name(node.func) or "").split(".")[-1] == "partial"
            and bool(node.args)
        )

    def _compiler(self, node: ast.expr) -> tuple[bool, bool | None]:
        """Whether an expression makes compiled callables when called or used as a decorator, and
        its `dynamic` written as a constant: `torch.compile`, `torch.compile(dynamic=False)`,
        `functools.partial(torch.compile, dynamic=False)`."""
        if self._is_compile(node):
            return True, None
        if not isinstance(node, ast.Call):
            return False, None
        if self._is_compile(node.func) and not node.args:
            return True, _constant_bool(node, "dynamic")
        if self._is_partial(node) and self._is_compile(node.args[0]):
            return True, _constant_bool(node, "dynamic")
        return False, None

    def _wraps_flex(self, node: ast.expr) -> bool:
        """flex_attention itself, or a `functools.partial` of it."""
        return self._is_flex(node) or (self._is_partial(node) and self._is_flex(node.args[0]))

    def _decorator_kind(self, decorator: ast.expr) -> tuple[bool, bool]:
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        dotted = dotted_name(target) or ""
        compiled = self._is_compile(target) or self._compiler(decorator)[0]
        disabled = any(dotted == name.replace("torch", t, 1) for t in self.torch_names for name in _DISABLE)
        return compiled, disabled

    # scopes --------------------------------------------------------------------------------
    def _function(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        kinds = [self._decorator_kind(d) for d in node.decorator_list]
        sites = self.facts.compile_sites
        for decorator in node.decorator_list:  # a project's own compile decorator, judged with the project
            name = dotted_name(decorator.func if isinstance(decorator, ast.Call) else decorator)
            if name and not any(kinds[node.decorator_list.index(decorator)]):
                sites.decorated.append((node.lineno, node.name, name.rsplit(".", 1)[-1]))
        parameters = {a.arg for a in (*node.args.posonlyargs, *node.args.args)}
        if (
            not self.classes
            and parameters
            and any(
                isinstance(n, ast.Call)
                and self._is_compile(n.func)
                and n.args
                and isinstance(n.args[0], ast.Name)
                and n.args[0].id in parameters
                for n in ast.walk(node)
            )
        ):
            sites.decorators.add(node.name)  # `def maybe_compile(func): return torch.compile(func)`
        if not self.functions and not self.classes:
            self.top_functions[node.name] = node
        called_as = f"{self.classes[-1]}.{node.name}" if self.classes and not self.functions else node.name
        static = [d for d in node.decorator_list if self._compiler(d) == (True, False)]
        self.static_functions.append((static[0].lineno, called_as) if static else None)
        self.functions.append((node.name, any(k[0] for k in kinds), any(k[1] for k in kinds)))
        self.generic_visit(node)
        self.functions.pop()
        self.static_functions.pop()

    def visit_If(self, node: ast.If) -> None:
        """Calls under `if args.compile:` / `if not use_compile:` are a compile switch's branches:
        a raw call there is the switch's eager side, taken on purpose."""
        switch = any(_COMPILE_SWITCH.search(name) for name in _names_in(node.test))
        if switch:
            self.switches.append(node.lineno)
        self.generic_visit(node)
        if switch:
            self.switches.pop()

    visit_IfExp = visit_If  # type: ignore[assignment]

    def visit_Return(self, node: ast.Return) -> None:
        """`def compile_flex(): return torch.compile(flex_attention)`: a factory; what module-level code
        binds its call to is a wrapper (torchtune's `flex_attention_compiled = compile_flex_attention()`)."""
        value = node.value
        if (
            len(self.functions) == 1
            and not self.classes
            and isinstance(value, ast.Call)
            and self._is_compile(value.func)
            and value.args
            and self._wraps_flex(value.args[0])
        ):
            self.factories.add(self.functions[0][0])
        self.generic_visit(node)

    def visit_Global(self, node: ast.Global) -> None:
        self.rebound_globals |= set(node.names)

    visit_FunctionDef = _function
    visit_AsyncFunctionDef = _function

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self.classes.append(node.name)
        self.generic_visit(node)
        self.classes.pop()

    @staticmethod
    def _reads_of(node: ast.FunctionDef | ast.AsyncFunctionDef) -> list[GlobalRead]:
        """Names a module-level function reads that it neither binds nor takes: globals."""
        local = {a.arg for a in (*node.args.args, *node.args.kwonlyargs, *node.args.posonlyargs)}
        names = [n for n in ast.walk(node) if isinstance(n, ast.Name)]
        local |= {n.id for n in names if isinstance(n.ctx, ast.Store)}
        return [
            GlobalRead(n.lineno, node.name, n.id) for n in names if isinstance(n.ctx, ast.Load) and n.id not in local
        ]

    # statements ----------------------------------------------------------------------------
    def _target_text(self, target: ast.expr) -> str | None:
        dotted = dotted_name(target)
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
        if self.functions and self._is_flex(value):
            for target in targets:
                if isinstance(target, ast.Name):
                    switch = self.switches[-1] if self.switches else None
                    self.aliases.setdefault(self._scope(), {})[target.id] = (line, switch)
        if not self.functions and not self.classes:
            for target in targets:
                number = isinstance(value, ast.Constant) and type(value.value) in (int, float)
                if isinstance(target, ast.Name) and number:
                    self.module_numbers.add(target.id)
        texts, reachable = [], []
        for target in targets:
            text = self._target_text(target)
            if text is None:
                continue
            texts.append(text)
            own = isinstance(target, ast.Attribute) and (dotted_name(target) or "").startswith("self.")
            if not own and not (self.functions and isinstance(target, ast.Name)):
                reachable.append(text)
        if isinstance(value, ast.Call) and texts:
            self.call_targets[id(value)] = texts
        if isinstance(value, ast.Call) and self._is_compile(value.func):
            self.bindings[line] = (texts, reachable)  # the CompileCall is made by visit_Call, next
            if self.functions:
                self.bound_in_function.add(line)
            if not self.functions and not self.classes and value.args and self._wraps_flex(value.args[0]):
                for target in targets:  # `flex_attention = torch.compile(flex_attention)`: its calls compiled
                    if isinstance(target, ast.Name) and target.id in self.flex_names:
                        self.compiled_flex_names.setdefault(target.id, line)
        elif texts and not self.switches:  # a compile switch's branches each bind it once: no rebinding
            self.assignments.append((line, texts, value))
        if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and reachable and not self.functions:
            self.factory_calls.append((line, value.func.id, reachable))

    def _scope(self) -> tuple[str, ...]:
        return (self.classes[-1] if self.classes else "", *(f[0] for f in self.functions))

    def _alias(self, func: ast.expr) -> tuple[int, int | None] | None:
        """A local name this function bound to raw flex_attention (`attend = flex_attention` in one
        branch, a compiled wrapper in another): (that line, the compile switch around it, if any)."""
        if not isinstance(func, ast.Name) or not self.functions:
            return None
        return self.aliases.get(self._scope(), {}).get(func.id)

    def _registered(self, node: ast.Call) -> None:
        """`ALL_ATTENTION_FUNCTIONS.register("name", fn)` / `AttentionInterface.register(...)`: fn runs
        inside the forward of the models that pick it, as their own code would."""
        dotted = dotted_name(node.func) or ""
        registers = dotted.endswith(".register") and "attention" in dotted.lower() and len(node.args) >= 2
        if registers and isinstance(node.args[1], ast.Name):
            self.facts.registered_attention.add(node.args[1].id)

    def _model_compile(self, node: ast.Call) -> None:
        """`block.compile()`, `aot_compile(...)`, `torch.export.export(model, ...)`: a model compiled
        whole, whose forward reaches the calls inside it."""
        dotted = dotted_name(node.func) or ""
        head, _, last = dotted.rpartition(".")
        method = last == "compile" and bool(head) and not self._is_compile(node.func) and _MODEL_WORD.search(head)
        if method or last in ("aot_compile", "aot_compile_module") or dotted.endswith("export.export"):
            self.facts.compile_sites.models.append(node.lineno)

    def visit_Call(self, node: ast.Call) -> None:
        if (dotted_name(node.func) or "").split(".")[-1] in _THREAD_WORDS:
            self.makes_threads = True
        callee = called_text(node.func, self.classes[-1] if self.classes else None)
        if callee is not None:
            self.calls_by_scope.setdefault(self._scope(), set()).add(callee)
            if self.classes and self.functions and isinstance(node.func, ast.Name):
                self.facts.called_in_methods.add(node.func.id)
        self._model_compile(node)
        self._registered(node)
        if node.args and self._compiler(node.func) == (True, False) and not self._is_compile(node.func):
            self._static(node.lineno, self.call_targets.get(id(node), []), self._wraps_flex(node.args[0]))
        if self._is_compile(node.func) and node.args:
            self._compile_call(node)
        elif self._is_flex(node.func) or self._alias(node.func) is not None:
            alias = self._alias(node.func)
            static = next((f for f in reversed(self.static_functions) if f is not None), None)
            if static is not None:
                self._static(static[0], [static[1]], True)
            call = RawCall(
                node.lineno,
                self.functions[-1][0] if self.functions else None,
                any(f[1] for f in self.functions),
                any(f[2] for f in self.functions),
                column=node.col_offset + 1,
                enclosing=tuple(f[0] for f in self.functions),
                cls=self.classes[-1] if self.classes else None,
                called_as=dotted_name(node.func) or "flex_attention",
                switch_line=self.switches[-1] if self.switches else (alias[1] if alias else None),
                alias_line=alias[0] if alias else None,
            )
            self.facts.raw_calls.append(call)
            self.call_scopes[id(call)] = self._scope()
            if len(node.args) >= 4 and isinstance(node.args[3], ast.Name):
                self.mods.add(node.args[3].id)
        for keyword in node.keywords:
            if keyword.arg in _MOD_KEYWORDS and isinstance(keyword.value, ast.Name):
                self.mods.add(keyword.value.id)
        if (
            (dotted_name(node.func) or "").endswith("create_block_mask")
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
        if not call.compiles_flex:
            self._compiled_thing(node.args[0])
        if call.dynamic is False:
            self._static(node.lineno, self.call_targets.get(id(node), []), self._wraps_flex(node.args[0]))

    def _compiled_thing(self, compiled: ast.expr) -> None:
        """`torch.compile(fn)` or `torch.compile(obj.method)`: the function by its last name, which
        the files that define it match; `torch.compile(model)` (a name that reads as a model, or a
        model made in place): a model compiled whole."""
        sites = self.facts.compile_sites
        dotted = dotted_name(compiled)
        if dotted is not None:
            sites.functions.setdefault(dotted.rsplit(".", 1)[-1], compiled.lineno)
        if isinstance(compiled, ast.Call) or (dotted is not None and _MODEL_WORD.search(dotted)):
            sites.models.append(compiled.lineno)

    def _static(self, line: int, called_as: list[str], wraps_flex: bool) -> None:
        """A flex_attention wrapper compiled with dynamic=False, remembered by the names its calls use
        (one bound to nothing is never called by name: nothing to follow)."""
        if wraps_flex and called_as and line not in self.static:
            self.static[line] = StaticWrapper(line, ", ".join(called_as), called_as)

    def _varying(self, tree: ast.Module) -> None:
        """Each static wrapper called with a length that varies: one fact per wrapper, at its compile."""
        called = {text: str(line) for line, wrapper in self.static.items() for text in wrapper.called_as}
        by_wrapper: dict[int, list[VaryingCall]] = {}
        for call in varying_calls(tree, called):
            by_wrapper.setdefault(int(call.wrapper), []).append(call)
        for line, calls in sorted(by_wrapper.items()):
            first, wrapper = calls[0], self.static[line]
            self.facts.static_varying.append(
                StaticVarying(line, wrapper.name, first.line, first.called, first.loop_line, len(calls))
            )

    def _factory_wrappers(self) -> None:
        """Module-level names bound to a factory's call are wrappers as a direct compile's are."""
        for line, factory, targets in self.factory_calls:
            if factory in self.factories and line not in self.bindings:
                self.bindings[line] = (targets, targets)
                self.facts.compiles.append(CompileCall(line, f"{factory}()", True, None, None))

    def forwarded_wrappers(self) -> list[tuple[int, str]]:
        """A wrapper compiled into a local and handed to another object's attribute
        (`layer.self_attn.flex_attention_compiled = compiled`), which a class of this file calls as
        `self.flex_attention_compiled(...)`: (the compile's line, `Class.attr`)."""
        locals_at = {
            text: call.line
            for call in self.facts.compiles
            if call.compiles_flex and call.in_function
            for text in call.bound_to
            if "." not in text
        }
        found = []
        for _line, texts, value in self.assignments:
            if not (isinstance(value, ast.Name) and value.id in locals_at):
                continue
            for text in texts:
                attr = text.rsplit(".", 1)[-1]
                for scope, callees in self.calls_by_scope.items():
                    if scope[0] and f"{scope[0]}.{attr}" in callees:
                        found.append((locals_at[value.id], f"{scope[0]}.{attr}"))
        return sorted(set(found))

    def finish(self, tree: ast.Module | None = None) -> FileFacts:
        self._factory_wrappers()
        wrappers: dict[str, int] = {}
        for call in self.facts.compiles:
            call.bound_to, call.reachable = self.bindings.get(call.line, ([], []))
            call.in_function = call.line in self.bound_in_function
            if call.compiles_flex:
                for text in call.bound_to:
                    wrappers.setdefault(text, call.line)
        for raw in self.facts.raw_calls:
            rebound_at = self.compiled_flex_names.get(raw.called_as)
            if rebound_at is not None and (raw.enclosing or raw.line > rebound_at):
                raw.compiled_by = f"`{raw.called_as} = torch.compile(...)` at line {rebound_at}"
            callees = self.calls_by_scope.get(self.call_scopes.get(id(raw), ()), set())
            raw.beside_compiled = bool(callees & set(wrappers))
        for line, texts, value in self.assignments:
            if self._is_flex(value):
                self.facts.raw_assignments += [(line, text) for text in texts if "." in text]
            placeholder = isinstance(value, ast.Constant) and value.value is None  # `_compiled = None`, filled later
            for text in texts:
                if text in wrappers and line > wrappers[text] and not placeholder:
                    self.facts.rebindings.append(Rebinding(line, text, ast.unparse(value), self._is_flex(value)))
        reads = [
            read
            for name in sorted(self.mods & set(self.top_functions))
            for read in self._reads_of(self.top_functions[name])
        ]
        self.facts.global_reads = [r for r in reads if r.name in self.module_numbers and r.name in self.rebound_globals]
        if tree is not None and self.static:
            self._varying(tree)
        if tree is not None and self.makes_threads:
            self.facts.threaded = threaded_calls(tree)
        self.facts.forwarded_wrappers = self.forwarded_wrappers()
        self.facts.functions = {
            name: (node.lineno, len(node.args.posonlyargs) + len(node.args.args), frozenset(_names_in(node)))
            for name, node in self.top_functions.items()
        }
        return self.facts


def file_facts(path: str, source: str | bytes, *, follow: bool = True) -> FileFacts:
    """The facts of one file (bytes: as read, decoded as Python decodes it: lint/parsing.py), in one
    pass over its tree, and, with `follow`, where static wrappers and threads need it, the walks that
    follow lengths and calls (`init` needs only the wrappers); SyntaxError (whatever the parser
    refuses), ValueError (a NUL byte, before Python 3.11.4) and RecursionError propagate to the caller."""
    collector = _Collector(path)
    tree = parse_source(path, source)
    collector.visit(tree)
    return collector.finish(tree if follow else None)


def thread_facts(path: str, source: str | bytes) -> FileFacts:
    """The facts of a file that never names flex_attention: only its threads can be at fault, so
    only they are looked for (lint-threaded-model-call), without the first pass."""
    return FileFacts(path, threaded=threaded_calls(parse_source(path, source)))


def _constant_bool(call: ast.Call, keyword: str) -> bool | None:
    value = next((k.value for k in call.keywords if k.arg == keyword), None)
    return value.value if isinstance(value, ast.Constant) and isinstance(value.value, bool) else None


def _names_in(test: ast.AST) -> list[str]:
    """The names and attribute names a condition reads (`args.compile` gives `args`, `compile`)."""
    names = []
    for node in ast.walk(test):
        if isinstance(node, ast.Name):
            names.append(node.id)
        elif isinstance(node, ast.Attribute):
            names.append(node.attr)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            names.append(node.value)  # `getattr(args, "compile")`, `cfg["compile"]`
    return names
