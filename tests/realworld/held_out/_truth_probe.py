"""Ground-truth probe for the held-out cases, written without dflashdoctor.

Usage: python tests/realworld/held_out/_truth_probe.py SCRIPT [ARGS...]  -> one JSON object on stdout.

It runs SCRIPT (runpy, as __main__) under torch.profiler and counts:
- dense_forwards: profiler events `aten::_safe_softmax` (only the unfused flex forward, `math_attention`,
  runs it; a fused Inductor kernel computes its softmax inside the generated kernel);
- dense_fwd_calls / dense_bwd_calls: calls of the two dense kernels that the flex higher-order ops
  dispatch to (`sdpa_dense`, `sdpa_dense_backward`, the CompositeExplicitAutograd kernels), counted by
  a wrapper on real tensors only (fake/functional tensors during tracing are skipped); each call is
  also labelled in the profiler (`DENSE_FLEX_FWD` / `DENSE_FLEX_BWD`), and for the backward the
  profiler's `aten::exp` count inside those labels is checked (the dense backward re-exponentiates
  the scores; the fused backward does not run that op);
- the first user frame (file:line function, class of `self`) that led to each dense call, and the
  dotted name of the innermost nn.Module on the stack (relative to the outermost one);
- dynamo's own records: get_compilation_metrics() (fail_reason, recompile_reason), graph-break counters.
"""

import collections
import contextlib
import importlib
import io
import json
import os
import runpy
import sys
import traceback

import torch
from torch._C import DispatchKey
from torch.profiler import profile, record_function

_fa = importlib.import_module("torch._higher_order_ops.flex_attention")

_HERE = os.path.abspath(os.path.dirname(__file__))
_TORCH = os.path.dirname(torch.__file__)
counts = collections.Counter()
sites = collections.Counter()
modules = collections.Counter()


def _real(t):
    from torch._subclasses.fake_tensor import FakeTensor
    from torch._subclasses.functional_tensor import FunctionalTensor

    return isinstance(t, torch.Tensor) and not isinstance(t, (FakeTensor, FunctionalTensor))


_is_real = torch._dynamo.disable(_real)


def _site(frame):
    for fr, lineno in traceback.walk_stack(frame):
        fn = fr.f_code.co_filename
        if fn.startswith(_TORCH) or "site-packages" in fn or fn == __file__ or "<" in fn:
            continue
        owner = type(fr.f_locals.get("self")).__name__ if "self" in fr.f_locals else ""
        return f"{os.path.basename(fn)}:{lineno} {fr.f_code.co_name}" + (f" [{owner}]" if owner else "")
    return "?"


def _module_name(frame):
    """Dotted name of the innermost nn.Module on the Python stack, relative to the outermost one
    (fx GraphModules, such as the one the eager flex path runs, are skipped unless nothing else is there)."""
    mods = []
    for fr, _ in traceback.walk_stack(frame):
        obj = fr.f_locals.get("self")
        if isinstance(obj, torch.nn.Module) and obj not in mods:
            mods.append(obj)
    if not mods:
        return None
    real = [m for m in mods if not isinstance(m, torch.fx.GraphModule)] or mods
    inner, outer = real[0], real[-1]
    for name, m in outer.named_modules():
        if m is inner:
            name = name.removeprefix("_orig_mod.").removeprefix("_orig_mod")
            return f"{name or '<root>'} ({type(inner).__name__} in {type(outer).__name__})"
    return type(inner).__name__


@torch._dynamo.disable
def _record(key):
    frame = sys._getframe(3)  # _record <- wrapper <- (dispatch) ...: start above the wrapper
    counts[key] += 1
    sites[f"{key} {_site(frame)}"] += 1
    modules[f"{key} {_module_name(frame)}"] += 1


def _wrap(hop, label, key):
    inner = hop.py_kernels[DispatchKey.CompositeExplicitAutograd]

    def wrapper(*args, **kwargs):
        if _is_real(args[0]):
            _record(key)
            with record_function(label):
                return inner(*args, **kwargs)
        return inner(*args, **kwargs)

    # the wrapper itself is invisible to dynamo (so the probe does not change what dynamo traces); the
    # dense kernel it calls stays under whatever compile callback the script had installed
    hop.py_kernels[DispatchKey.CompositeExplicitAutograd] = torch._dynamo.disable(wrapper, recursive=False)
    hop._dispatch_cache.clear()


def main():
    script, *args = sys.argv[1:]
    _wrap(_fa.flex_attention, "DENSE_FLEX_FWD", "dense_fwd_calls")
    _wrap(_fa.flex_attention_backward, "DENSE_FLEX_BWD", "dense_bwd_calls")
    sys.argv = [script, *args]
    out = io.StringIO()
    err = None
    with contextlib.redirect_stdout(out), profile() as prof:
        try:
            runpy.run_path(script, run_name="__main__")
        except SystemExit:
            pass
        except Exception as e:  # report, do not hide
            err = f"{type(e).__name__}: {e}"[:500]
    events = list(prof.events())
    names = collections.Counter(e.name for e in events)
    bwd_exp = 0
    bwd_ranges = [(e.time_range.start, e.time_range.end) for e in events if e.name == "DENSE_FLEX_BWD"]
    for e in events:
        if e.name == "aten::exp" and any(s <= e.time_range.start <= t for s, t in bwd_ranges):
            bwd_exp += 1
    metrics = torch._dynamo.utils.get_compilation_metrics()
    from torch._dynamo.utils import counters

    print(
        json.dumps(
            {
                "error": err,
                "dense_forwards": names["aten::_safe_softmax"],
                "dense_fwd_calls": counts["dense_fwd_calls"],
                "dense_backwards": counts["dense_bwd_calls"],
                "aten_exp_inside_dense_bwd": bwd_exp,
                "dense_sites": dict(sites),
                "dense_modules": dict(modules),
                "compiles": [
                    {
                        "id": m.compile_id,
                        "co_name": m.co_name,
                        "co_where": f"{os.path.basename(m.co_filename or '')}:{m.co_firstlineno}",
                        "fail_type": m.fail_type,
                        "fail_reason": (m.fail_reason or "")[:300] or None,
                        "recompile_reason": (m.recompile_reason or "")[:300] or None,
                    }
                    for m in metrics
                ],
                "graph_breaks": dict(counters["graph_break"]),
                "unique_graphs": counters["stats"].get("unique_graphs"),
                "script_stdout_tail": out.getvalue()[-400:],
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
