"""Ground truth for a real-code case, taken without dflashdoctor: the case script runs under
torch.profiler, and the dense flex_attention forward is counted by the op only its unfused kernel
runs (`aten::_safe_softmax`: the fused Inductor kernel computes its softmax inside the generated
kernel), and dynamo's own compile records say which frames hit the recompile limit.

Usage: python ground_truth.py SCRIPT [ARGS...]; prints one JSON object on stdout.
"""

import contextlib
import io
import json
import runpy
import sys

import torch
from torch.profiler import profile

_DENSE_SOFTMAX = "aten::_safe_softmax"


def main() -> None:
    script, *args = sys.argv[1:]
    sys.argv = [script, *args]
    with contextlib.redirect_stdout(io.StringIO()), profile() as prof:
        runpy.run_path(script, run_name="__main__")
    metrics = torch._dynamo.utils.get_compilation_metrics()
    limit_hits = [m for m in metrics if "recompile limit" in (m.fail_reason or "").lower()]
    print(
        json.dumps(
            {
                "dense_forwards": sum(1 for e in prof.events() if e.name == _DENSE_SOFTMAX),
                "recompile_limit_hits": len(limit_hits),
                "compiles": len(metrics),
            }
        )
    )


if __name__ == "__main__":
    main()
