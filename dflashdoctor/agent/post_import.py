"""Run a callback right after a module is imported by the program, without importing it ourselves.

A finder placed first on `sys.meta_path` asks the other finders for the spec of a watched name and
wraps its loader, so the callback runs once the module's code has executed. torch is never imported
by the instrumentation: a process that never imports it (torchrun's launcher, a tokenizer worker)
pays nothing.
"""

from __future__ import annotations

import importlib.abc
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

Callback = Callable[[ModuleType], None]


class _AfterExec(importlib.abc.Loader):
    def __init__(self, loader: Any, name: str) -> None:
        self.loader, self.name = loader, name

    def create_module(self, spec: Any) -> ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.loader.exec_module(module)
        module.__loader__ = self.loader  # leave the module as if we were never there
        if module.__spec__ is not None:
            module.__spec__.loader = self.loader
        for callback in _watcher.take(self.name):  # once: a spec asked for twice still runs them once
            callback(module)

    def __getattr__(self, name: str) -> Any:  # get_resource_reader, is_package, ...
        return getattr(self.loader, name)


class _Watcher(importlib.abc.MetaPathFinder):
    def __init__(self) -> None:
        self.callbacks: dict[str, list[Callback]] = {}

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        """The callback stays until the module really executes: libraries ask for torch's spec
        (`importlib.util.find_spec("torch")`) long before they import it."""
        if name not in self.callbacks:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _AfterExec(spec.loader, name)
                return spec
        return None

    def take(self, name: str) -> list[Callback]:
        callbacks = self.callbacks.pop(name, [])
        if not self.callbacks and self in sys.meta_path:  # nothing left to watch: out of the way
            sys.meta_path.remove(self)
        return callbacks


_watcher = _Watcher()


def when_imported(name: str, callback: Callback) -> None:
    """`callback(module)` once `name` is imported; at once if it already is. Several callbacks for
    one name run in the order given."""
    if name in sys.modules:
        callback(sys.modules[name])
        return
    _watcher.callbacks.setdefault(name, []).append(callback)
    if _watcher not in sys.meta_path:
        sys.meta_path.insert(0, _watcher)
