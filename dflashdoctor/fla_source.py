"""FLA's platform flags read from its source and evaluated with this machine's facts, without
importing `fla.utils`.

Why: importing `fla.utils` asks torch and triton about GPU 0 (`torch.cuda.get_device_name(0)`,
triton's `get_current_target()`), which initialises CUDA in the importing process. The env probe
lists the GPUs with nvidia-smi for that reason (initialising CUDA there cost seconds of every gate on
an H200, beside the probes that need the GPU), and importing `fla.utils` brought it back wherever FLA
is installed. FLA's flags are module-level expressions (`IS_NVIDIA_HOPPER = IS_NVIDIA and ('NVIDIA H'
in torch.cuda.get_device_name(0) or ...)`, `TRITON_ABOVE_3_7_1 = package_version.parse(
triton.__version__) >= package_version.parse("3.7.1")`): they are evaluated here as FLA wrote them,
and what they ask is answered from `Facts` that need no CUDA context. An expression that asks for
anything else (a call not listed in `_CALLS`, a name bound twice, a name it cannot find) raises
`Unknown`, and the caller imports `fla.utils` as before: the flags are FLA's own or not read here,
never guessed.

Probed side: standard library; triton (its version and its active driver) and packaging (FLA's own
version parser) only where FLA is installed.
"""

from __future__ import annotations

import ast
import operator
import os
import platform
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

Gpu = tuple[str, tuple[int, int]]  # a CUDA device's name and (major, minor) capability
_PACKAGE = "fla.utils"  # the package whose flags FLA's ops read (`from fla.utils import IS_...`)
_GET_DEVICE = "fla.utils.hardware.get_available_device"  # FLA's backend question, behind device_platform
# triton's backend folder -> the `backend` of the GPUTarget its driver reports (what FLA compares)
_TARGET_BACKEND = {"nvidia": "cuda", "amd": "hip"}
_STR_METHODS = frozenset({"lower", "upper", "strip", "startswith", "endswith"})
_COMPARE: dict[type[ast.cmpop], Callable[[Any, Any], bool]] = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
    ast.In: lambda a, b: a in b,
    ast.NotIn: lambda a, b: a not in b,
    ast.Is: operator.is_,
    ast.IsNot: operator.is_not,
}


class Unknown(Exception):
    """FLA's source asks something not answered here: the caller imports `fla.utils` instead."""


@dataclass(frozen=True)
class Facts:
    """What FLA's flag expressions ask of the machine, each answered without a CUDA context."""

    platform: str  # what FLA's get_available_device() returns: triton's target backend, or "cpu"
    gpu0: Gpu | None  # CUDA device 0 (the current device of a fresh process), where known
    triton_version: str  # `triton.__version__`, which FLA parses

    def device_name(self, index: int | None = 0) -> str:
        return self._gpu(index)[0]

    def device_capability(self, index: int | None = 0) -> tuple[int, int]:
        return self._gpu(index)[1]

    def _gpu(self, index: int | None) -> Gpu:
        if index not in (0, None) or self.gpu0 is None:  # None: the current device, 0 in a fresh process
            raise Unknown(f"CUDA device {index} is not known without initialising CUDA")
        return self.gpu0


def triton_platform() -> str:
    """What FLA's `get_available_device()` would return, without asking the driver for a device.
    FLA returns `triton.runtime.driver.active.get_current_target().backend`, or "cpu" when that
    raises. The active driver is made here as FLA's call makes it (triton picks it; none active or
    one that cannot be built: "cpu"); its target's backend is named from the backend it belongs to,
    since `get_current_target()` itself asks torch for the current device, which initialises CUDA."""
    try:
        import triton
        from triton.backends import backends

        active = triton.runtime.driver.active
    except Exception:  # what FLA catches too: no active driver, or one that cannot be built
        return "cpu"
    owners = [name for name, backend in backends.items() if isinstance(active, backend.driver)]
    if len(owners) != 1 or owners[0] not in _TARGET_BACKEND:
        raise Unknown(f"triton's active driver {type(active).__name__} has no target name known here")
    return _TARGET_BACKEND[owners[0]]


def machine_facts(gpu0: Gpu | None) -> Facts:
    """This machine's facts; `gpu0` from a listing that needs no CUDA context (nvidia-smi). A GPU
    platform without a known GPU 0 is Unknown: FLA would name it (`torch.cuda.get_device_name()`)."""
    import triton

    backend = triton_platform()
    if backend != "cpu" and gpu0 is None:
        raise Unknown("the GPU is not known without initialising CUDA")
    return Facts(backend, gpu0, str(triton.__version__))


def _parse_version(text: str) -> Any:
    from packaging import version  # FLA's own parser (fla/utils/env.py): a dependency of FLA

    return version.parse(text)


# Calls FLA's flag expressions make, by the dotted name they are imported under, answered from Facts
# or with the same pure function FLA calls.
_CALLS: dict[str, Callable[..., Any]] = {
    "torch.cuda.get_device_name": lambda facts, index=0: facts.device_name(index),
    "torch.cuda.get_device_capability": lambda facts, index=0: facts.device_capability(index),
    "packaging.version.parse": lambda _facts, text: _parse_version(text),
    "platform.machine": lambda _facts: platform.machine(),
    "os.getenv": lambda _facts, *args: os.getenv(*args),
    "os.environ.get": lambda _facts, *args: os.environ.get(*args),
    _GET_DEVICE: lambda facts: facts.platform,
}
_VALUES: dict[str, Callable[[Facts], Any]] = {"triton.__version__": lambda facts: facts.triton_version}


@dataclass(frozen=True)
class _Ref:
    """A dotted name from a module's imports or definitions (`torch.cuda.get_device_name`): not a
    value, something to call or to take an attribute of."""

    dotted: str


class _Module:
    """One file of `fla.utils`: the names its top level binds exactly once (assignments, imports,
    functions); a name bound more than once, or inside a block, is ambiguous without running it."""

    def __init__(self, name: str, path: Path) -> None:
        self.name = name
        self.values: dict[str, ast.expr] = {}
        self.refs: dict[str, str] = {}
        counts: dict[str, int] = {}
        for node in ast.parse(path.read_bytes(), filename=str(path)).body:
            for bound in self._bind(node):
                counts[bound] = counts.get(bound, 0) + 1
        self.ambiguous = {bound for bound, count in counts.items() if count > 1}

    def _bind(self, node: ast.stmt) -> list[str]:
        """Record what one top-level statement binds; the names it binds, for the count."""
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            self.values[node.targets[0].id] = node.value
            return [node.targets[0].id]
        if isinstance(node, ast.Import | ast.ImportFrom):
            return self._imports(node)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            self.refs[node.name] = f"{self.name}.{node.name}"
            return [node.name]
        return [n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)]

    def _imports(self, node: ast.Import | ast.ImportFrom) -> list[str]:
        if isinstance(node, ast.Import):
            for alias in node.names:
                local = alias.asname or alias.name.partition(".")[0]
                self.refs[local] = alias.name if alias.asname else local
            return [alias.asname or alias.name.partition(".")[0] for alias in node.names]
        base = node.module or ""
        if node.level:  # `from .env import X` inside fla/utils
            parent = self.name.rsplit(".", node.level - (1 if self.name == _PACKAGE else 0))[0]
            base = f"{parent}.{base}" if base else parent
        for alias in node.names:
            self.refs[alias.asname or alias.name] = f"{base}.{alias.name}"
        return [alias.asname or alias.name for alias in node.names]


class _Evaluator:
    """FLA's flag expressions evaluated in their own module's names, with `Facts` for what they ask."""

    def __init__(self, folder: Path, facts: Facts) -> None:
        self._folder = folder
        self._facts = facts
        self._modules: dict[str, _Module] = {}
        self._done: dict[tuple[str, str], Any] = {}
        self._busy: set[tuple[str, str]] = set()

    def module(self, name: str) -> _Module | None:
        """A module of the package, parsed once; None for one that is not a file of `fla.utils`."""
        if name not in self._modules:
            if name != _PACKAGE and not name.startswith(f"{_PACKAGE}."):
                return None
            relative = name[len(_PACKAGE) :].strip(".").split(".")
            path = self._folder.joinpath(*relative).with_suffix(".py") if relative != [""] else None
            path = path or self._folder / "__init__.py"
            if not path.is_file():
                return None
            try:
                self._modules[name] = _Module(name, path)
            except (OSError, SyntaxError, ValueError) as exc:
                raise Unknown(f"{path} cannot be read: {exc}") from None
        return self._modules[name]

    def name(self, module: _Module, name: str) -> Any:
        """The value `name` has in `module` once imported (a `_Ref` for what it imports or defines)."""
        if name in module.ambiguous:
            raise Unknown(f"{module.name}.{name} is bound more than once")
        key = (module.name, name)
        if key in self._done:
            return self._done[key]
        if key in self._busy:
            raise Unknown(f"{module.name}.{name} refers to itself")
        self._busy.add(key)
        try:
            value = self._bound(module, name)
        finally:
            self._busy.discard(key)
        self._done[key] = value
        return value

    def _bound(self, module: _Module, name: str) -> Any:
        if name in module.values:
            return self.expr(module, module.values[name])
        if name not in module.refs:
            raise Unknown(f"{module.name} binds no {name}")
        dotted = module.refs[name]
        source, _, attr = dotted.rpartition(".")
        defining = self.module(source) if source != module.name else None
        return self.name(defining, attr) if defining is not None else _Ref(dotted)

    def expr(self, module: _Module, node: ast.expr) -> Any:
        handler = getattr(self, f"_{type(node).__name__.lower()}", None)
        if handler is None:
            raise Unknown(f"{ast.unparse(node)}: {type(node).__name__} is not evaluated here")
        return handler(module, node)

    def _constant(self, _module: _Module, node: ast.Constant) -> Any:
        return node.value

    def _name(self, module: _Module, node: ast.Name) -> Any:
        return self.name(module, node.id)

    def _tuple(self, module: _Module, node: ast.Tuple) -> tuple[Any, ...]:
        return tuple(self.expr(module, element) for element in node.elts)

    def _attribute(self, module: _Module, node: ast.Attribute) -> Any:
        base = self.expr(module, node.value)
        if isinstance(base, _Ref):
            dotted = f"{base.dotted}.{node.attr}"
            return _VALUES[dotted](self._facts) if dotted in _VALUES else _Ref(dotted)
        if isinstance(base, str) and node.attr in _STR_METHODS:
            return getattr(base, node.attr)
        raise Unknown(f"{ast.unparse(node)} is not evaluated here")

    def _call(self, module: _Module, node: ast.Call) -> Any:
        if node.keywords or any(isinstance(arg, ast.Starred) for arg in node.args):
            raise Unknown(f"{ast.unparse(node)}: keyword or starred arguments")
        function = self.expr(module, node.func)
        args = [self.expr(module, arg) for arg in node.args]
        if isinstance(function, _Ref) and function.dotted in _CALLS:
            return _CALLS[function.dotted](self._facts, *args)
        if callable(function) and getattr(function, "__name__", "") in _STR_METHODS:
            return function(*args)
        raise Unknown(f"{ast.unparse(node)}: a call not answered here")

    def _boolop(self, module: _Module, node: ast.BoolOp) -> Any:
        value: Any = None
        for operand in node.values:  # short-circuits as Python does: later operands may ask nothing
            value = self.expr(module, operand)
            if bool(value) == isinstance(node.op, ast.Or):
                return value
        return value

    def _unaryop(self, module: _Module, node: ast.UnaryOp) -> Any:
        if not isinstance(node.op, ast.Not):
            raise Unknown(f"{ast.unparse(node)}: operator not evaluated here")
        return not self.expr(module, node.operand)

    def _compare(self, module: _Module, node: ast.Compare) -> bool:
        left = self.expr(module, node.left)
        for op, right_node in zip(node.ops, node.comparators, strict=True):
            right = self.expr(module, right_node)
            if not _COMPARE[type(op)](left, right):
                return False
            left = right
        return True

    def _subscript(self, module: _Module, node: ast.Subscript) -> Any:
        value, index = self.expr(module, node.value), self.expr(module, node.slice)
        if not isinstance(value, tuple | list | str) or not isinstance(index, int):
            raise Unknown(f"{ast.unparse(node)}: subscript not evaluated here")
        return value[index]

    def _ifexp(self, module: _Module, node: ast.IfExp) -> Any:
        return self.expr(module, node.body if self.expr(module, node.test) else node.orelse)


class SourceFlags(Mapping[str, bool]):
    """FLA's flags as `vars(fla.utils)` holds them (upper-case names bound to a bool), each evaluated
    from source when first asked for; a flag whose expression asks what is not known raises Unknown."""

    def __init__(self, folder: str, facts: Facts) -> None:
        self._evaluator = _Evaluator(Path(folder) / "utils", facts)
        package = self._evaluator.module(_PACKAGE)
        if package is None:
            raise Unknown(f"{folder} has no utils package")
        self._package = package
        self._names = sorted(n for n in {*package.values, *package.refs} if n.isupper())

    def __getitem__(self, name: str) -> bool:
        if name not in self._names:
            raise KeyError(name)
        value = self._evaluator.name(self._package, name)
        if not isinstance(value, bool):
            raise KeyError(name)
        return value

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)

    def platform(self) -> str:
        """FLA's `device_platform`, evaluated as its flags are."""
        value = self._evaluator.name(self._package, "device_platform")
        if not isinstance(value, str):
            raise Unknown("device_platform is not a string")
        return value


def version_literal(folder: str) -> str | None:
    """`__version__` as FLA's `__init__.py` assigns it, a string literal; None where it does not."""
    try:
        tree = ast.parse((Path(folder) / "__init__.py").read_bytes())
    except (OSError, SyntaxError, ValueError):
        return None
    for node in tree.body:
        if (
            isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == "__version__" for t in node.targets)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        ):
            return node.value.value
    return None
