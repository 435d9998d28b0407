"""The package's import graph, read from the source: no circle of imports anywhere at run time, none
at all (type-only imports counted) through the commands and the gate, and the commands below the
gate and the registry (the gate composes the commands; no command knows it). A circle there is how
the gate's configuration and the probe commands once came to need each other (seven files that
could only be understood, imported or tested together)."""

from __future__ import annotations

import ast
from pathlib import Path

import dflashdoctor

ROOT = Path(dflashdoctor.__file__).parent


def _module_names() -> dict[str, Path]:
    names = {}
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return names


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imported(node: ast.AST, package: str) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.ImportFrom):
        base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
        module = ".".join([*base, *([node.module] if node.module else [])])
        return [module, *(f"{module}.{alias.name}" for alias in node.names)]
    return []


def _imports(name: str, path: Path, modules: dict[str, Path], *, type_only: bool) -> set[str]:
    """The package's modules `name` imports: at module level or in a function (a lazy import still
    ties the two), and with `type_only` those under `if TYPE_CHECKING:` too."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node) and not type_only:
            for child in node.orelse:
                visit(child)
            return
        for target in _imported(node, package):
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text(encoding="utf-8")))
    return found


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        circles.append(sorted(component))
    return circles


def _graph(*, type_only: bool) -> dict[str, set[str]]:
    modules = _module_names()
    return {name: _imports(name, path, modules, type_only=type_only) for name, path in modules.items()}


def test_no_module_imports_itself_back_at_run_time():
    assert _circles(_graph(type_only=False)) == []


def test_the_commands_and_the_gate_are_in_no_circle_even_for_types():
    layered = ("dflashdoctor.commands", "dflashdoctor.gate", "dflashdoctor.registry", "dflashdoctor.cli")
    through = [c for c in _circles(_graph(type_only=True)) if any(m.startswith(layered) for m in c)]
    assert through == []


def _imports_under(package: str, graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """What each module of `package` (the package's own __init__ too) imports of this package."""
    return {name: imported for name, imported in graph.items() if name == package or name.startswith(package + ".")}


def test_the_commands_are_below_the_gate_and_the_registry():
    """The layers, read from the real imports (type-only ones too): commands/ holds single-probe
    commands, which know no gate, no registry of every probe and no CLI; the gate, above them, composes
    them (gate/ imports commands/, never the other way)."""
    graph = _graph(type_only=True)
    above = ("dflashdoctor.gate", "dflashdoctor.registry", "dflashdoctor.cli")
    upward = {
        name: sorted(m for m in imported if m in above or m.startswith(tuple(f"{a}." for a in above)))
        for name, imported in _imports_under("dflashdoctor.commands", graph).items()
    }
    assert {name: found for name, found in upward.items() if found} == {}
    composed = set().union(*_imports_under("dflashdoctor.gate", graph).values())
    assert {"dflashdoctor.commands.check_compile", "dflashdoctor.registry"} <= composed


def test_the_reader_sees_a_circle_where_there_is_one():
    """The test above would pass on a graph it misreads: a circle built from the real reader's rules
    (a relative import, a lazy one in a function, a type-only one) is found."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _circles(graph) == [["a", "b", "c"]]
    modules = _module_names()
    gate = _imports("dflashdoctor.gate.table", modules["dflashdoctor.gate.table"], modules, type_only=True)
    assert {"dflashdoctor.gate.config", "dflashdoctor.budgets"} <= gate
    agent = "dflashdoctor.agent.torch_instruments"
    assert "dflashdoctor.agent.process" in _imports(agent, modules[agent], modules, type_only=True)
    assert "dflashdoctor.agent.process" not in _imports(agent, modules[agent], modules, type_only=False)
