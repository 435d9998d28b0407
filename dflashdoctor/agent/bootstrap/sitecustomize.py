"""Loaded by every Python process `dflashdoctor run` starts (this folder is first on PYTHONPATH).

It starts the dflashdoctor agent, then hands over to the sitecustomize this one shadows, if any.
The agent comes from the program's own environment when that has the doctor's version of
dflashdoctor, else from the doctor's copy, which `_package/dflashdoctor` links to. That copy is
imported from the link's target, not through the link: the link goes with the run's temporary
folder, and a file the report names (the reference trainer's) must still be there after it.
Nothing here may break the program: a failure is printed once and the program runs on.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType

_HERE = os.path.dirname(os.path.abspath(__file__))


class _DoctorsCopy:
    """Finds the `dflashdoctor` package in the doctor's folder, and nothing else: the folder's parent
    (the doctor's site-packages, another torch) stays off the program's path."""

    def __init__(self, folder: str) -> None:
        self.folder = folder

    def find_spec(
        self, name: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if name != "dflashdoctor":  # asked of every import the program makes: the name first
            return None
        init = os.path.join(self.folder, "__init__.py")
        if not os.path.isfile(init):
            return None
        return importlib.util.spec_from_file_location(name, init, submodule_search_locations=[self.folder])


def _use_the_doctors_copy() -> None:
    wanted = os.environ.get("DFLASHDOCTOR_RUN_VERSION")
    spec = importlib.util.find_spec("dflashdoctor")
    if spec is not None:
        import dflashdoctor

        if dflashdoctor.__version__ == wanted:
            return
        for name in [n for n in sys.modules if n == "dflashdoctor" or n.startswith("dflashdoctor.")]:
            del sys.modules[name]
    sys.meta_path.insert(0, _DoctorsCopy(os.path.realpath(os.path.join(_HERE, "_package", "dflashdoctor"))))


try:
    _use_the_doctors_copy()
    from dflashdoctor.agent.process import start_from_environment

    _dflashdoctor_agent = start_from_environment()
except Exception as _exc:  # the program matters more than its diagnosis
    print(f"dflashdoctor: instrumentation not started: {type(_exc).__name__}: {_exc}", file=sys.stderr)


def _chain_to_shadowed_sitecustomize() -> None:
    for entry in sys.path:
        folder = os.path.abspath(entry or ".")
        if folder == _HERE:
            continue
        candidate = os.path.join(folder, "sitecustomize.py")
        if os.path.isfile(candidate):
            spec = importlib.util.spec_from_file_location("_shadowed_sitecustomize", candidate)
            if spec is not None and spec.loader is not None:
                spec.loader.exec_module(importlib.util.module_from_spec(spec))
            return


try:
    _chain_to_shadowed_sitecustomize()
except Exception as _exc:
    print(f"dflashdoctor: the shadowed sitecustomize raised: {type(_exc).__name__}: {_exc}", file=sys.stderr)
