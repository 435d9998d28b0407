"""Resolving a TARGET (`package.module:attr` or `path/to/file.py:attr`) and describing what it is.

Probed side: the user's module is imported where it will run, in the probe's interpreter. Every way
the spec can be wrong becomes a `UsageError` with one line that names the problem.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import os
import sys
from dataclasses import asdict, dataclass, field
from types import ModuleType
from typing import Any, cast

from dflashdoctor.call_plan import CallPlan, UnusableSignature, plan_call
from dflashdoctor.probe_support import UsageError
from dflashdoctor.records import BoundName, CallPlanRecord, TargetRecord

_COMPILED_HINT = "compile"
# Set by the doctor when the current folder was left off the probe's path (runner.py): why.
CWD_LEFT_OFF = "DFLASHDOCTOR_CWD_LEFT_OFF"


@dataclass
class TargetInfo:
    """What static inspection learned about the target, before calling it."""

    spec: str
    kind: str  # "compiled-wrapper" | "raw-flex" | "function" | "callable"
    qualname: str
    module: str | None
    file: str | None
    line: int | None
    wraps: str | None = None  # for a compiled wrapper: what it compiles
    compiled_globals: list[str] = field(default_factory=list)  # compiled wrappers it reads
    backends: dict[str, str] = field(default_factory=dict)  # compiled wrapper name -> backend
    raw_flex_globals: list[str] = field(default_factory=list)  # raw flex_attention names it reads
    rebound: BoundName | None = None  # a compiled-looking name bound to the raw function
    assigned: BoundName | None = None  # where the module binds the attribute, if it does
    call: CallPlanRecord | None = None  # check-compile's CallPlan.to_dict(): how the target was called

    def to_dict(self) -> TargetRecord:
        """Its record: the fields are the record's keys (tests/unit/test_records.py holds them together)."""
        return cast(TargetRecord, asdict(self))


def split_spec(spec: str) -> tuple[str, str]:
    module_part, sep, attr = spec.rpartition(":")
    if not sep or not module_part or not attr:
        raise UsageError(f"target {spec!r} is not of the form package.module:attr or path/to/file.py:attr")
    return module_part, attr


def _load_file(path: str) -> ModuleType:
    if not os.path.isfile(path):
        raise UsageError(f"no such file: {path}")
    path = os.path.abspath(path)
    name = "dflashdoctor_target_" + os.path.splitext(os.path.basename(path))[0].replace("-", "_")
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise UsageError(f"cannot load {path} as Python source")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    sys.path.insert(0, os.path.dirname(path))  # so the file's sibling imports work
    spec.loader.exec_module(module)
    return module


def _import(module_part: str) -> ModuleType:
    try:
        if module_part.endswith(".py") or os.sep in module_part:
            return _load_file(module_part)
        return importlib.import_module(module_part)
    except UsageError:
        raise
    except SyntaxError as exc:
        raise UsageError(f"syntax error in {exc.filename}:{exc.lineno}: {exc.msg}") from exc
    except ModuleNotFoundError as exc:
        if exc.name and module_part.startswith(exc.name):
            left_off = os.environ.get(CWD_LEFT_OFF)
            hint = f" (the current folder is not on the probe's path: {left_off})" if left_off else ""
            raise UsageError(f"no module named {module_part!r}{hint}") from exc
        raise UsageError(f"importing {module_part!r} failed: {exc}") from exc
    except (Exception, SystemExit, KeyboardInterrupt) as exc:  # sys.exit at import is a failed import too
        raise UsageError(f"importing {module_part!r} failed: {type(exc).__name__}: {exc}") from None


def resolve(spec: str) -> tuple[Any, ModuleType, str]:
    """The object named by `spec`, the module it came from, and the attribute path."""
    module_part, attr = split_spec(spec)
    module = _import(module_part)
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise UsageError(f"{module_part} has no attribute {attr!r}") from None
        except Exception as exc:  # a module __getattr__ or a property that raises: the target's own doing
            raise UsageError(f"looking up {attr!r} in {module_part} raised {type(exc).__name__}: {exc}") from None
    if not callable(obj):
        raise UsageError(f"{spec} is a {type(obj).__name__}, not a callable")
    return obj, module, attr


def plan_target_call(obj: Any, spec: str, heads: int, kv_heads: int) -> CallPlan:
    """How check-compile will call the target, read from its signature (call_plan.py says why); a
    signature it cannot be called with is bad input, one line naming what is wrong."""
    try:
        return plan_call(obj, heads, kv_heads)
    except UnusableSignature as exc:
        raise UsageError(f"{spec} does not take flex_attention's call convention: {exc}") from None


def _last_assignment_line(module: ModuleType, name: str) -> int | None:
    """Line of the last top-level assignment to `name`: where a rebinding happened."""
    try:
        tree = ast.parse(inspect.getsource(module))
    except (OSError, TypeError, SyntaxError):
        return None
    lines = [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign | ast.AnnAssign)
        for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
        if isinstance(target, ast.Name) and target.id == name
    ]
    return max(lines) if lines else None


def _inner_blocks(node: ast.stmt) -> list[list[ast.stmt]]:
    """The statement lists of a block that still runs at module level (not a function's body)."""
    if isinstance(node, ast.If | ast.For | ast.While):
        return [node.body, node.orelse]
    if isinstance(node, ast.With):
        return [node.body]
    if isinstance(node, ast.Try | ast.TryStar):
        return [node.body, node.orelse, node.finalbody, *(handler.body for handler in node.handlers)]
    return []


def _top_level_names(body: list[ast.stmt]) -> set[str] | None:
    """Names a module binds at its top level (inside if/try/with blocks too); None when it cannot be
    known without running it (`from x import *`)."""
    names: set[str] = set()
    for node in body:
        if isinstance(node, ast.ImportFrom) and any(alias.name == "*" for alias in node.names):
            return None
        if isinstance(node, ast.Import | ast.ImportFrom):
            names |= {(alias.asname or alias.name).split(".")[0] for alias in node.names}
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
        for block in _inner_blocks(node):
            found = _top_level_names(block)
            if found is None:
                return None
            names |= found
    return names


def unbound_problem(spec: str) -> str | None:
    """Why `spec` names nothing, read without importing or running it (a file given to --script may be
    the wrapper's module: importing it would run the script), or None when it may well exist."""
    module_part, attr = split_spec(spec)
    if module_part.endswith(".py") or os.sep in module_part:
        path = module_part
        if not os.path.isfile(path):
            return f"no such file: {path}"
    else:
        try:
            found = importlib.util.find_spec(module_part)
        except (ImportError, ValueError):
            found = None
        if found is None:
            return f"no module named {module_part!r}"
        path = found.origin or ""
        if not path.endswith(".py"):
            return None  # a compiled or namespace module: the run will tell
    try:
        with open(path, "rb") as handle:
            names = _top_level_names(ast.parse(handle.read()).body)
    except (OSError, SyntaxError, ValueError):
        return None
    name = attr.split(".")[0]
    if names is not None and name not in names:
        return f"{module_part} binds no top-level name {name!r}"
    return None


def compile_backend(wrapper: Any) -> str | None:
    """The backend a torch.compile wrapper compiles with ("inductor", "eager", "aot_eager", ...).

    The wrapper's closure holds dynamo's OptimizeContext, whose callback wraps the backend;
    `innermost_backend` unwraps it. Private and layout-dependent, so any surprise gives None.
    """
    try:
        from torch._dynamo.convert_frame import innermost_backend
    except ImportError:
        return None
    for cell in getattr(wrapper, "__closure__", None) or ():
        try:
            callback = getattr(cell.cell_contents, "callback", None)
        except ValueError:  # an empty cell
            continue
        if callback is None:
            continue
        try:
            backend = innermost_backend(callback)
        except Exception:
            return None
        name = getattr(backend, "compiler_name", None) or getattr(backend, "__name__", None)
        return name if isinstance(name, str) else None
    return None


def _location(obj: Any) -> tuple[str | None, int | None]:
    inner = inspect.unwrap(obj) if callable(obj) else obj
    try:
        return inspect.getsourcefile(inner), inspect.getsourcelines(inner)[1]
    except (OSError, TypeError):
        return None, None


def describe(obj: Any, module: ModuleType, attr: str, spec: str) -> TargetInfo:
    from torch.nn.attention.flex_attention import flex_attention as raw_flex

    file, line = _location(obj)
    info = TargetInfo(
        spec=spec,
        kind="callable",
        qualname=getattr(obj, "__qualname__", attr),
        module=getattr(obj, "__module__", module.__name__),
        file=file,
        line=line,
    )
    if "." not in attr:
        line_assigned = _last_assignment_line(module, attr)
        if line_assigned:
            info.assigned = {
                "name": attr,
                "file": getattr(module, "__file__", None),
                "line": line_assigned,
                "module": module.__name__,
            }
    wrapped = getattr(obj, "_torchdynamo_orig_callable", None)
    # torch.compiler.disable marks its wrapper like a compiled one; it is the function it wraps,
    # read below (torchtune's compile_friendly_flex_attention is one around a compiled flex_attention).
    if wrapped is not None and not getattr(obj, "_torchdynamo_disable", False):
        info.kind = "compiled-wrapper"
        info.wraps = f"{getattr(wrapped, '__module__', '?')}.{getattr(wrapped, '__qualname__', wrapped)}"
        backend = compile_backend(obj)
        if backend:
            info.backends[attr] = backend
        return info
    if obj is raw_flex:
        info.kind = "raw-flex"
        if _COMPILED_HINT in attr.lower():
            line = _last_assignment_line(module, attr.split(".")[-1])
            info.rebound = {"name": attr, "file": module.__file__, "line": line, "module": module.__name__}
        return info
    code = getattr(inspect.unwrap(obj), "__code__", None)
    if code is None:
        return info
    info.kind = "function"
    home = inspect.getmodule(inspect.unwrap(obj)) or module
    for name in code.co_names:
        value = getattr(home, name, None)
        if getattr(value, "_torchdynamo_orig_callable", None) is not None:
            info.compiled_globals.append(name)
            backend = compile_backend(value)
            if backend:
                info.backends[name] = backend
        elif value is raw_flex:
            info.raw_flex_globals.append(name)
            if _COMPILED_HINT in name.lower() and info.rebound is None:
                info.rebound = {
                    "name": name,
                    "file": getattr(home, "__file__", None),
                    "line": _last_assignment_line(home, name),
                    "module": home.__name__,
                }
    return info
