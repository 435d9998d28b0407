"""Ground truth for a real-code case, taken without dflashdoctor: the case script runs under
torch.profiler, and the dense flex_attention forward is counted by the op only its unfused kernel
runs (`aten::_safe_softmax`: the fused Inductor kernel computes its softmax inside the generated
kernel), and dynamo's own compile records say which frames hit the recompile limit.

The dense kernels are also counted where flex's higher-order ops reach them: the forward and the
backward op each dispatch to a CompositeExplicitAutograd kernel (`sdpa_dense`,
`sdpa_dense_backward`) only when nothing compiled them; a wrapper counts those calls on real tensors
(tracing's fake/functional tensors are skipped) and names the first user frame that led to each.
Dynamo's records say more: each compile's recompile reason and failure, the graph breaks it counted,
and the frames it skipped (with its reason), those in user code listed apart.

Usage: python ground_truth.py SCRIPT [ARGS...]; prints one JSON object on stdout (its last line).
Keys: dense_forwards, recompile_limit_hits, compiles (as before); dense_fwd_calls, dense_backwards,
dense_sites, recompile_reasons, fail_reasons, graph_breaks, graph_break_reasons, skipped_frames,
skipped_frames_total, ddp_optimizer_subgraphs (subgraphs of each graph DDPOptimizer split), error (the
script's exception, or null; the probe still exits 0 with it).
"""

import collections
import contextlib
import importlib
import io
import json
import os
import runpy
import sys
import sysconfig
import traceback

import torch
from torch._C import DispatchKey
from torch.profiler import profile

_DENSE_SOFTMAX = "aten::_safe_softmax"
_TORCH = os.path.dirname(torch.__file__)
_STDLIB = sysconfig.get_paths()["stdlib"]
_dense = collections.Counter()
_sites = collections.Counter()
_skips: list[str] = []
_ddp_splits: list[int] = []


def _library(filename: str) -> bool:
    return filename.startswith((_TORCH, _STDLIB)) or "site-packages" in filename or "<" in filename


def _head(text: str | None) -> str:
    """A dynamo reason without the stack trace it appends."""
    return (text or "").split("\nUser stack trace")[0].strip()[:300]


def _real(tensor) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor
    from torch._subclasses.functional_tensor import FunctionalTensor

    return isinstance(tensor, torch.Tensor) and not isinstance(tensor, (FakeTensor, FunctionalTensor))


def _user_frame() -> str:
    for frame, lineno in traceback.walk_stack(sys._getframe(2)):
        filename = frame.f_code.co_filename
        if _library(filename) or filename == __file__:
            continue
        owner = type(frame.f_locals["self"]).__name__ if "self" in frame.f_locals else ""
        return f"{os.path.basename(filename)}:{lineno} {frame.f_code.co_name}" + (f" [{owner}]" if owner else "")
    return "?"


def _count_dense(hop, key: str) -> None:
    inner = hop.py_kernels[DispatchKey.CompositeExplicitAutograd]

    def counted(*args, **kwargs):
        if _real(args[0]):
            _dense[key] += 1
            _sites[f"{key} {_user_frame()}"] += 1
        return inner(*args, **kwargs)

    hop.py_kernels[DispatchKey.CompositeExplicitAutograd] = counted
    hop._dispatch_cache.clear()


def _record_skips() -> None:
    convert_frame = importlib.import_module("torch._dynamo.convert_frame")
    add = getattr(convert_frame, "add_skip_reason", None)
    if add is None:  # a torch without skip reasons
        return

    def recorded(reason, frame):
        code = frame.f_code
        _skips.append(f"{code.co_name} ({code.co_filename}:{code.co_firstlineno}): {reason}")
        return add(reason, frame)

    convert_frame.add_skip_reason = recorded


def _record_ddp_splits() -> None:
    """How many subgraphs DDPOptimizer (optimize_ddp) split each compiled graph into."""
    try:
        distributed = importlib.import_module("torch._dynamo.backends.distributed")
        compile_fn = distributed.DDPOptimizer.compile_fn
    except (ImportError, AttributeError):  # a torch built without distributed
        return

    def recorded(self, gm, example_inputs, **kwargs):
        split = compile_fn(self, gm, example_inputs, **kwargs)
        children = split.named_children() if isinstance(split, torch.nn.Module) else ()
        _ddp_splits.append(sum(1 for name, _ in children if name.startswith("submod")) or 1)
        return split

    distributed.DDPOptimizer.compile_fn = recorded


def main() -> None:
    script, *args = sys.argv[1:]
    hops = importlib.import_module("torch._higher_order_ops.flex_attention")
    _count_dense(hops.flex_attention, "fwd")
    _count_dense(hops.flex_attention_backward, "bwd")
    _record_skips()
    _record_ddp_splits()
    sys.argv = [script, *args]
    error = None
    with contextlib.redirect_stdout(io.StringIO()), profile() as prof:
        try:
            runpy.run_path(script, run_name="__main__")
        except SystemExit as exit_:
            if exit_.code not in (None, 0):
                error = f"SystemExit: {exit_.code}"
        except Exception as exc:  # the script's own failure is part of its truth
            error = f"{type(exc).__name__}: {exc}"[:600]
    metrics = torch._dynamo.utils.get_compilation_metrics()
    limit_hits = [m for m in metrics if "recompile limit" in (m.fail_reason or "").lower()]
    counters = torch._dynamo.utils.counters
    user_skips = sorted({s for s in _skips if not _library(s.split("(", 1)[1].split(":", 1)[0])})
    print(
        json.dumps(
            {
                "dense_forwards": sum(1 for e in prof.events() if e.name == _DENSE_SOFTMAX),
                "recompile_limit_hits": len(limit_hits),
                "compiles": len(metrics),
                "dense_fwd_calls": _dense["fwd"],
                "dense_backwards": _dense["bwd"],
                "dense_sites": dict(_sites),
                "recompile_reasons": [
                    f"{m.co_name}: {_head(m.recompile_reason)}" for m in metrics if m.recompile_reason
                ],
                "fail_reasons": [
                    f"{m.co_name}: {m.fail_type}: {_head(m.fail_reason)}"
                    for m in metrics
                    if m.fail_type or m.fail_reason
                ],
                "graph_breaks": sum(counters["graph_break"].values()),
                "graph_break_reasons": {k[:300]: v for k, v in counters["graph_break"].items()},
                "skipped_frames": user_skips,
                "skipped_frames_total": len(_skips),
                "ddp_optimizer_subgraphs": _ddp_splits,
                "error": error,
            }
        )
    )


if __name__ == "__main__":
    main()
