"""What the installed autotuner classes keep on the shared instance during a call, read from source.

Per-call state is an attribute `run` writes on `self` (directly, or in a closure it defines); it is
shared by every thread that calls the same kernel. The audit lists each such attribute with the
methods that write and read it, and whether `run` takes a lock (a `with` on something named like a
lock). It reads the source with `ast`; nothing is executed. A class whose source cannot be read is
reported as not audited, never guessed.
"""

from __future__ import annotations

import ast
import importlib.util
import inspect
import textwrap
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

_CLASSES = (
    ("triton.runtime.autotuner", "Autotuner"),
    ("fla.ops.utils.cache", "CachedAutotuner"),
)


@dataclass
class ClassAudit:
    cls: str  # module.Class
    audited: bool
    reason: str = ""  # why not audited
    base_run: bool = False  # its own run calls super().run (inherits the base's per-call state)
    locked: bool = False
    per_call_state: dict[str, dict[str, list[str]]] = field(default_factory=dict)  # attr -> writers/readers

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _self_attributes(node: ast.AST) -> tuple[set[str], set[str]]:
    """(attributes of `self` written, attributes read) anywhere under `node`."""
    written: set[str] = set()
    read: set[str] = set()
    for sub in ast.walk(node):
        target = sub.value if isinstance(sub, ast.Subscript) and isinstance(sub.ctx, ast.Store) else sub
        if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self":
            stored = isinstance(sub.ctx, ast.Store) if isinstance(sub, ast.Attribute | ast.Subscript) else False
            (written if stored else read).add(target.attr)
    return written, read


def _takes_lock(run: ast.FunctionDef) -> bool:
    for node in ast.walk(run):
        if isinstance(node, ast.With | ast.AsyncWith):
            for item in node.items:
                if "lock" in ast.unparse(item.context_expr).lower():
                    return True
    return False


def _calls_super_run(run: ast.FunctionDef) -> bool:
    return any(
        isinstance(node, ast.Attribute) and node.attr == "run" and "super" in ast.unparse(node.value)
        for node in ast.walk(run)
    )


def audit_class(cls: type) -> ClassAudit:
    name = f"{cls.__module__}.{cls.__qualname__}"
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError, SyntaxError) as exc:
        return ClassAudit(cls=name, audited=False, reason=f"source not readable: {exc}")
    body = tree.body[0]
    return _audit_body(name, body) if isinstance(body, ast.ClassDef) else ClassAudit(name, False, "not a class")


def _audit_body(name: str, body: ast.ClassDef) -> ClassAudit:
    methods = {n.name: n for n in body.body if isinstance(n, ast.FunctionDef)}
    run = methods.get("run")
    if run is None:
        return ClassAudit(cls=name, audited=True, reason="defines no run of its own")
    written_in_run, _ = _self_attributes(run)
    access = {method: _self_attributes(node) for method, node in methods.items() if method != "__init__"}
    state = {
        attr: {
            "written_by": sorted(m for m, (w, _) in access.items() if attr in w),
            "read_by": sorted(m for m, (_, r) in access.items() if attr in r),
        }
        for attr in sorted(written_in_run)
    }
    return ClassAudit(
        cls=name, audited=True, base_run=_calls_super_run(run), locked=_takes_lock(run), per_call_state=state
    )


def _module_file(module_name: str) -> Path | None:
    """Where an installed module's source is, found without importing it or its package: importing
    `fla.ops.utils.cache` imports every FLA op first (8 s of CPU on the dev machine, about 10 s on
    an H200), all for a class the audit only reads."""
    top, _, rest = module_name.partition(".")
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return Path(spec.origin) if spec is not None and spec.origin and not rest else None
    base = Path(next(iter(spec.submodule_search_locations))).joinpath(*rest.split(".")) if rest else None
    if base is None:
        return Path(spec.origin) if spec.origin else None
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def audit_installed() -> list[ClassAudit]:
    """Audits of the autotuner classes installed here (triton's, and FLA's subclass if present), read
    from their source files."""
    audits = []
    for module_name, class_name in _CLASSES:
        name = f"{module_name}.{class_name}"
        path = _module_file(module_name)
        if path is None:
            audits.append(ClassAudit(cls=name, audited=False, reason="not installed here"))
            continue
        try:
            tree = ast.parse(path.read_bytes(), filename=str(path))
        except (OSError, SyntaxError, ValueError) as exc:
            audits.append(ClassAudit(cls=name, audited=False, reason=f"source not readable: {exc}"))
            continue
        found = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == class_name]
        if not found:
            audits.append(ClassAudit(cls=name, audited=False, reason=f"{path.name} defines no class {class_name}"))
            continue
        audits.append(_audit_body(name, found[0]))
    return audits


def live_autotuners(package: str = "fla") -> list[dict[str, Any]]:
    """Autotuned kernels held as module globals of a loaded package: every thread shares each one."""
    import sys

    from triton.runtime.autotuner import Autotuner

    found = []
    for module_name, module in list(sys.modules.items()):
        if not module_name.startswith(f"{package}.") or module is None:
            continue
        for attr, value in list(vars(module).items()):
            if isinstance(value, Autotuner):
                base = getattr(value, "base_fn", None)
                found.append(
                    {
                        "kernel": getattr(base, "__name__", attr),
                        "module": module_name,
                        "class": type(value).__name__,
                        "configs": len(getattr(value, "configs", []) or []),
                        "key": list(getattr(value, "keys", []) or []),
                    }
                )
    return sorted(found, key=lambda k: (k["module"], k["kernel"]))
