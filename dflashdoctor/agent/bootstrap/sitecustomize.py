"""Loaded by every Python process `dflashdoctor run` starts (this folder is first on PYTHONPATH).

It starts the dflashdoctor agent, then hands over to the sitecustomize this one shadows, if any.
Nothing here may break the program: any failure is printed once and the program runs on.
"""

import importlib.util
import os
import sys

try:
    from dflashdoctor.agent.process import start_from_environment

    _dflashdoctor_agent = start_from_environment()
except Exception as _exc:  # the program matters more than its diagnosis
    print(f"dflashdoctor: instrumentation not started: {type(_exc).__name__}: {_exc}", file=sys.stderr)


def _chain_to_shadowed_sitecustomize() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    for entry in sys.path:
        if os.path.abspath(entry or ".") == here:
            continue
        candidate = os.path.join(entry or ".", "sitecustomize.py")
        if os.path.isfile(candidate):
            spec = importlib.util.spec_from_file_location("_shadowed_sitecustomize", candidate)
            if spec is not None and spec.loader is not None:
                spec.loader.exec_module(importlib.util.module_from_spec(spec))
            return


try:
    _chain_to_shadowed_sitecustomize()
except Exception as _exc:
    print(f"dflashdoctor: the shadowed sitecustomize raised: {type(_exc).__name__}: {_exc}", file=sys.stderr)
