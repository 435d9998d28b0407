"""What the installed flash-linear-attention (FLA) cannot run here, in FLA's own words.

Two ways a machine cannot run FLA's kernels, neither of them the model's fault:
- FLA is installed but triton has no GPU backend here (FLA itself says so: its `device_platform`
  is "cpu"), or the model runs on the CPU: transformers still binds FLA's kernels at import, and the
  first call fails ("0 active drivers");
- FLA refuses a kernel on this combination of triton and GPU architecture with a guard of its own,
  `if <flags>: raise RuntimeError(...)` (fla-core 0.6.0 refuses the gated delta rule's backward on
  Hopper with triton >= 3.4.0 and < 3.7.1). The guards are read from the installed FLA's source and
  their flags evaluated with FLA's own values (`fla.utils`), so no version pair is written here.

Probed side: standard library; `fla.utils` (torch, triton) only where FLA is installed.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import sys
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from importlib import metadata
from typing import Any

GPU_PLATFORMS = ("cuda", "hip", "xpu")  # triton backends FLA runs its kernels on
_FLAG_PREFIXES = ("IS_", "TRITON_ABOVE_", "TRITON_BELOW_")  # FLA's platform and version flags


@dataclass
class FlaGuard:
    """One `if ...: raise RuntimeError(...)` in FLA whose condition reads FLA's platform flags."""

    file: str
    line: int  # of the raise
    function: str
    message: str
    flags: dict[str, bool] = field(default_factory=dict)  # each flag of the condition, its value here
    other_terms: list[str] = field(default_factory=list)  # terms that depend on the call (`g is not None`)
    applies: bool = False  # every flag term holds here: the guard refuses whenever the other terms do

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def fla_folder() -> str | None:
    """The installed FLA's package folder, found without importing it."""
    try:
        spec = importlib.util.find_spec("fla")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return next(iter(spec.submodule_search_locations))


def fla_flags() -> tuple[str, dict[str, Any]]:
    """FLA's platform (its triton backend: cuda, hip, xpu, or cpu when triton has no GPU here) and
    its flags, from `fla.utils`; ("unavailable: ...", {}) when that does not import."""
    try:
        import fla.utils as utils
    except Exception as exc:  # a broken FLA, a triton that does not load: not ours to fix here
        return f"unavailable: {type(exc).__name__}: {exc}"[:300], {}
    flags = {k: v for k, v in vars(utils).items() if k.isupper() and isinstance(v, bool)}
    return str(getattr(utils, "device_platform", "unknown")), flags


def _installed(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def _gpu_name() -> str | None:
    """The GPU FLA's flags were read on (fla.utils has imported torch by then)."""
    torch = sys.modules.get("torch")
    try:
        return torch.cuda.get_device_name() if torch is not None and torch.cuda.is_available() else None
    except Exception:  # a driver that fails here: the flags still say what FLA saw
        return None


def _runs_on(platform: str, device: str) -> bool:
    """FLA's kernels run on a GPU triton supports, and only for a model on it."""
    return platform in GPU_PLATFORMS and device != "cpu"


def fla_unusable_on(device: str) -> bool:
    """FLA is installed but its kernels cannot run for a model on `device` (a torch device type):
    the cheap question, without reading FLA's guards."""
    return fla_folder() is not None and not _runs_on(fla_flags()[0], device)


def fla_state(device: str | None = None) -> dict[str, Any] | None:
    """FLA as a run on `device` meets it: its version, platform, whether its kernels can run (a GPU
    platform, and the run not on the CPU) and every guard of its own, evaluated here. `device` None:
    the GPU where triton has one. None where FLA is not installed."""
    if fla_folder() is None:
        return None
    platform, flags = fla_flags()
    on_gpu = platform in GPU_PLATFORMS
    device = device or ("cuda" if on_gpu else "cpu")
    return {
        "version": _installed("fla-core") or _installed("flash-linear-attention"),
        "triton": _installed("triton"),
        "gpu": _gpu_name() if on_gpu else None,
        "platform": platform,
        "device": device,
        "usable": _runs_on(platform, device),
        "guards": [guard.to_dict() for guard in fla_guards(flags)],
    }


@contextmanager
def fla_kept_out(when: bool = True) -> Iterator[None]:
    """Keeps `fla` from importing while a model is built (`when` it cannot run), so that transformers
    binds its own torch code to the linear-attention layers: its hub-kernel decorators bind FLA's
    kernels, when FLA imports, as the modeling module is imported, whether they can run or not. What
    was bound stays bound; afterwards `fla` imports again as before."""
    if not when:
        yield
        return
    saved = sys.modules.get("fla")
    sys.modules["fla"] = None  # type: ignore[assignment]  # an import of fla or below now raises
    try:
        yield
    finally:
        if saved is None:
            sys.modules.pop("fla", None)
        else:
            sys.modules["fla"] = saved


def _terms(test: ast.expr) -> list[ast.expr]:
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):
        return [t for value in test.values for t in _terms(value)]
    return [test]


def _flag(term: ast.expr) -> tuple[str, bool] | None:
    """A term that is a flag (`IS_NVIDIA_HOPPER`) or its negation: the name, and whether it is negated."""
    negated = isinstance(term, ast.UnaryOp) and isinstance(term.op, ast.Not)
    inner = term.operand if isinstance(term, ast.UnaryOp) and negated else term
    if isinstance(inner, ast.Name) and inner.id.isupper() and inner.id.startswith(_FLAG_PREFIXES):
        return inner.id, negated
    return None


def _message(raised: ast.expr | None) -> str | None:
    if not (isinstance(raised, ast.Call) and isinstance(raised.func, ast.Name) and raised.func.id == "RuntimeError"):
        return None
    parts = [a.value for a in raised.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
    return "".join(parts) or None


def _guards_in(path: str, flags: dict[str, Any]) -> list[FlaGuard]:
    try:
        with open(path, encoding="utf-8") as handle:
            source = handle.read()
    except (OSError, UnicodeDecodeError):
        return []
    if "raise RuntimeError" not in source:
        return []
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    found: dict[int, FlaGuard] = {}  # by the raise's line: a nested function's guard is its own (walked later)
    for function in (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)):
        for node in ast.walk(function):
            if not isinstance(node, ast.If):
                continue
            raises = [s for s in node.body if isinstance(s, ast.Raise)]
            message = _message(raises[0].exc) if raises else None
            terms = _terms(node.test)
            named = [f for f in map(_flag, terms) if f]
            if message is None or not named:
                continue
            holds = [name in flags and bool(flags[name]) != negated for name, negated in named]
            values = {name: bool(flags.get(name)) for name, _ in named}
            others = [ast.unparse(t) for t in terms if _flag(t) is None]
            line = raises[0].lineno
            found[line] = FlaGuard(path, line, function.name, message, values, others, all(holds))
    return sorted(found.values(), key=lambda guard: guard.line)


def fla_guards(flags: dict[str, Any]) -> list[FlaGuard]:
    """Every platform guard in the installed FLA's ops, evaluated with `flags` (from `fla_flags`)."""
    folder = fla_folder()
    if folder is None:
        return []
    ops = os.path.join(folder, "ops")
    return [
        guard
        for parent, _dirs, files in os.walk(ops)
        for name in sorted(files)
        if name.endswith(".py")
        for guard in _guards_in(os.path.join(parent, name), flags)
    ]


def refusing_guard(exc: BaseException, guards: list[FlaGuard]) -> FlaGuard | None:
    """The guard an exception came from: raised by FLA's code at one of its guards' raise lines."""
    if not isinstance(exc, RuntimeError):
        return None
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return None
    last = frames[-1]
    here = os.path.realpath(last.filename)
    for guard in guards:
        same_place = here == os.path.realpath(guard.file) and last.name == guard.function
        if same_place and abs((last.lineno or 0) - guard.line) <= 2:  # a raise may span lines
            return guard
    return None
