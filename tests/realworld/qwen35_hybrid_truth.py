"""Ground truth for qwen35_hybrid_script.py, taken without dflashdoctor: the script runs as __main__
under `sys.setprofile`, which counts the calls of the attention functions (the gated delta rule's
torch code in transformers, FLA's kernel entry `chunk_gated_delta_rule`, sdpa), and the model it
built is read back from its globals: the names of its modules of each layer class, and its config's
layer types. Dynamo's own counters give the graph breaks. Without CUDA, FLA is kept from importing
(`sys.modules["fla"] = None`), as a CPU run without FLA has it: FLA's kernels need a GPU.

Usage: python qwen35_hybrid_truth.py SCRIPT [ARGS...]; prints one JSON object on stdout.
"""

import contextlib
import io
import json
import runpy
import sys
from collections import Counter
from types import FrameType
from typing import Any

_COUNTED = (
    *("torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule", "chunk_gated_delta_rule"),
    "sdpa_attention_forward",
)


def main() -> None:
    script, *args = sys.argv[1:]
    import torch
    from torch._dynamo.utils import counters

    if not torch.cuda.is_available():
        sys.modules["fla"] = None  # type: ignore[assignment]

    calls: Counter[str] = Counter()

    def count(frame: FrameType, event: str, _arg: Any) -> None:
        if event == "call" and frame.f_code.co_name in _COUNTED:
            calls[frame.f_code.co_name] += 1

    sys.argv = [script, *args]
    with contextlib.redirect_stdout(io.StringIO()):
        sys.setprofile(count)
        try:
            namespace = runpy.run_path(script, run_name="__main__")
        finally:
            sys.setprofile(None)
    model = namespace["model"]
    by_class: dict[str, list[str]] = {}
    for name, module in model.named_modules():
        by_class.setdefault(type(module).__name__, []).append(name)
    print(
        json.dumps(
            {
                "calls": calls,
                "modules": by_class,
                "layer_types": model.config.layer_types,
                "config": model.config.to_diff_dict(),
                "graph_breaks": sum(counters["graph_break"].values()),
            }
        )
    )


if __name__ == "__main__":
    main()
