"""Dotted module names (`model.layers.3.self_attn`) for code that only holds the module object.

A call made from inside `Module.forward` has the module as `self` in the calling frames; the
outermost such `self` is the root model, and `root.named_modules()` names the innermost one.
Walking frames happens once per new module; names are cached per root, weakly: a model freed
between traced parts must not lend its names to new modules that reuse its objects' ids.
"""

from __future__ import annotations

import weakref
from types import FrameType

import torch

from dflashdoctor.hooks.dynamo_skip import skip_tree

_MAX_FRAMES = 200


class ModuleNamer:
    def __init__(self) -> None:
        self._names: weakref.WeakKeyDictionary[torch.nn.Module, str] = weakref.WeakKeyDictionary()
        self._named_roots: weakref.WeakSet[torch.nn.Module] = weakref.WeakSet()

    def add_root(self, root: torch.nn.Module) -> None:
        """Name a model's modules up front (its hooks fire where no caller frame holds the root)."""
        self._name_root(root)

    def _name_root(self, root: torch.nn.Module) -> None:
        if root in self._named_roots:
            return
        self._named_roots.add(root)
        for name, module in root.named_modules():
            # torch.compile's OptimizedModule holds the model as `_orig_mod`: name it as the model.
            name = ".".join(part for part in name.split(".") if part != "_orig_mod")
            self._names.setdefault(module, name or type(module).__name__)

    def name(self, module: torch.nn.Module, frame: FrameType | None) -> str:
        """The module's dotted name under the outermost calling module that holds it, else its class
        name. (A trainer object may hold a model outside its own module tree, as a frozen target.)"""
        if module not in self._names:
            callers: list[torch.nn.Module] = []
            for _ in range(_MAX_FRAMES):
                if frame is None:
                    break
                candidate = frame.f_locals.get("self")
                if isinstance(candidate, torch.nn.Module) and (not callers or callers[-1] is not candidate):
                    callers.append(candidate)
                frame = frame.f_back
            for root in reversed(callers):  # outermost first
                self._name_root(root)
                if module in self._names:
                    break
        return self._names.get(module, type(module).__name__)

    def named_modules(self) -> list[tuple[str, torch.nn.Module]]:
        """Every module named so far that is still alive, with its name."""
        return [(name, module) for module, name in list(self._names.items())]

    def calling_module(self, frame: FrameType | None) -> str | None:
        """The name of the innermost module whose forward is on the stack above `frame`."""
        module = self.calling_self(frame)
        return self.name(module, frame) if module is not None else None

    @staticmethod
    def calling_self(frame: FrameType | None) -> torch.nn.Module | None:
        """The innermost module whose forward is on the stack above `frame`, unnamed (cheap)."""
        while frame is not None:
            # f_locals builds a dict per frame: read it only where the code has a `self`
            if "self" in frame.f_code.co_varnames or "self" in frame.f_code.co_cellvars:
                candidate = frame.f_locals.get("self")
                if isinstance(candidate, torch.nn.Module):
                    return candidate
            frame = frame.f_back
        return None


for _lookup in (ModuleNamer.name, ModuleNamer.calling_module, ModuleNamer.calling_self):
    skip_tree(_lookup)  # bookkeeping, called from stand-ins' frames (dynamo_skip.py says why)
