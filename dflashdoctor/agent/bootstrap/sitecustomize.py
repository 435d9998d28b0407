"""Loaded by every Python process `dflashdoctor run` starts (this folder is first on PYTHONPATH).

It starts the dflashdoctor agent, then hands over to the sitecustomize this one shadows, if any.
The agent comes from the program's own environment when that has the doctor's version of
dflashdoctor (so file names in the report are real paths), else from `_package/`, a link to the
doctor's copy. Nothing here may break the program: a failure is printed once and the program runs on.
"""

import importlib.util
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))


def _use_the_doctors_copy() -> None:
    wanted = os.environ.get("DFLASHDOCTOR_RUN_VERSION")
    spec = importlib.util.find_spec("dflashdoctor")
    if spec is not None:
        import dflashdoctor

        if dflashdoctor.__version__ == wanted:
            return
        for name in [n for n in sys.modules if n == "dflashdoctor" or n.startswith("dflashdoctor.")]:
            del sys.modules[name]
    sys.path.insert(0, os.path.join(_HERE, "_package"))


try:
    _use_the_doctors_copy()
    from dflashdoctor.agent.process import start_from_environment

    _dflashdoctor_agent = start_from_environment()
except Exception as _exc:  # the program matters more than its diagnosis
    print(f"dflashdoctor: instrumentation not started: {type(_exc).__name__}: {_exc}", file=sys.stderr)


def _chain_to_shadowed_sitecustomize() -> None:
    for entry in sys.path:
        folder = os.path.abspath(entry or ".")
        if folder in (_HERE, os.path.join(_HERE, "_package")):
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
