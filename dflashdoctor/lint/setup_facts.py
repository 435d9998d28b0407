"""What `init` needs to know about a repository, read with `ast` like lint's facts: the compiled
flex_attention wrappers and what they are bound to, transformers models asked for flex attention,
thread pools, and the programs that train (their entry point, whether they start a process group).
Shell scripts are only searched for their launch lines (torchrun, accelerate launch, srun)."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field

from dflashdoctor.lint.facts import bound_targets, file_facts

_LAUNCHER = re.compile(
    r"^\s*(?:[A-Z_]+=\S+\s+)*"  # VAR=value prefixes
    r"(torchrun|accelerate launch|srun|deepspeed|python3?\s+-m\s+torch\.distributed\.run)\b.*$"
)
_THREADS = {"ThreadPoolExecutor", "Thread"}


@dataclass
class Place:
    file: str  # relative to the repository root
    line: int
    what: str


@dataclass
class SetupFacts:
    wrappers: list[Place] = field(default_factory=list)  # what = "file.py:attr" as a target spells it
    wrapper_backends: dict[str, str | None] = field(default_factory=dict)  # target -> backend written
    hf_flex: list[Place] = field(default_factory=list)
    thread_pools: list[Place] = field(default_factory=list)
    trainers: list[Place] = field(default_factory=list)  # entry points that step an optimizer
    distributed: set[str] = field(default_factory=set)  # files that start a process group
    launchers: list[Place] = field(default_factory=list)


class _Uses(ast.NodeVisitor):
    def __init__(self) -> None:
        self.hf_flex: list[int] = []
        self.threads: list[int] = []
        self.main: int | None = None
        self.steps = False
        self.process_group = False
        self.imports_torch = False

    def visit_Import(self, node: ast.Import) -> None:
        self.imports_torch |= any(a.name == "torch" or a.name.startswith("torch.") for a in node.names)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        self.imports_torch |= (node.module or "").split(".")[0] == "torch"

    def visit_If(self, node: ast.If) -> None:
        test = node.test
        if (
            isinstance(test, ast.Compare)
            and isinstance(test.left, ast.Name)
            and test.left.id == "__name__"
            and any(isinstance(c, ast.Constant) and c.value == "__main__" for c in test.comparators)
        ):
            self.main = node.lineno
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        if name in _THREADS:
            self.threads.append(node.lineno)
        elif name == "init_process_group":
            self.process_group = True
        elif name in ("step", "backward") and isinstance(node.func, ast.Attribute):
            self.steps = True
        for keyword in node.keywords:
            value = keyword.value
            flex = isinstance(value, ast.Constant) and value.value == "flex_attention"
            if keyword.arg == "attn_implementation" and flex:
                self.hf_flex.append(node.lineno)
        self.generic_visit(node)


def python_setup(facts: SetupFacts, relative: str, source: str) -> None:
    """Add what one Python file says (SyntaxError and ValueError propagate to the caller)."""
    tree = ast.parse(source, filename=relative)
    uses = _Uses()
    uses.visit(tree)
    facts.hf_flex += [Place(relative, line, 'attn_implementation="flex_attention"') for line in uses.hf_flex]
    if uses.imports_torch:
        facts.thread_pools += [Place(relative, line, "a thread pool or thread") for line in uses.threads]
    if uses.main is not None and uses.steps and uses.imports_torch:
        facts.trainers.append(Place(relative, uses.main, "an entry point"))
    if uses.process_group:
        facts.distributed.add(relative)
    if "flex_attention" not in source:
        return
    for call in file_facts(relative, source).compiles:
        if not call.compiles_flex:
            continue
        for bound in bound_targets(tree, call.line, reachable_only=True):
            target = f"{relative}:{bound}"
            facts.wrappers.append(Place(relative, call.line, target))
            facts.wrapper_backends[target] = call.backend


def shell_setup(facts: SetupFacts, relative: str, text: str) -> None:
    for number, line in enumerate(text.splitlines(), 1):
        if _LAUNCHER.match(line):
            facts.launchers.append(Place(relative, number, line.strip()[:200]))
