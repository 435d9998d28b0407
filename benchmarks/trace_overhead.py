"""Cost of trace-attention's recorders on a compiled DFlash drafter training step.

    python benchmarks/trace_overhead.py --device cuda
    python benchmarks/trace_overhead.py --device cuda --context 8192 --blocks 128
    python benchmarks/trace_overhead.py --device cpu --repeats 3   # forward only, tiny scale
    python benchmarks/trace_overhead.py --device cuda --path hf-flex --repeats 20 --context 4096 --blocks 128

Plain: the reference drafter (the qwen27b-dflash preset: full scale on CUDA, tiny on CPU) whose
layers call a `torch.compile(flex_attention)` wrapper; one step is forward and, on CUDA, backward.
Traced: the same drafter and inputs with everything trace-attention installs active (the dense-path
hook, the attention-interface recorder, the flex-call recorder) and its layers calling a wrapper
compiled under the recorder, as a user's wrapper is when traced: each call goes through the recording
wrapper, which also hooks the backward. Both wrappers are compiled and warmed before timing; each
repeat times `--steps` steps in the order plain, traced, traced, plain, so that drift in clocks or
load hits both alike; the figure is the median per-step time over all samples, the ratio
traced/plain, and a 95% bootstrap interval of that ratio.

`--path hf-flex`: the drafter's layers call transformers' own flex integration instead
(`ALL_ATTENTION_FUNCTIONS["flex_attention"]`, its compiled singleton), as a drafter built with
attn_implementation="flex_attention" does; traced, each call then passes the attention-interface
recorder's wrapper.
"""

from __future__ import annotations

from contextlib import ExitStack

import torch
from drafter_bench import abba, describe, drafter_options, drafter_step, print_ratio, seconds_per_step, use
from torch.nn.attention.flex_attention import flex_attention

from dflashdoctor.hooks.flex_calls import FlexCallRecorder
from dflashdoctor.hooks.flex_dense import DenseFlexRecorder
from dflashdoctor.hooks.hf_attention import HFAttentionRecorder
from dflashdoctor.hooks.module_names import ModuleNamer


def main() -> None:
    args = drafter_options(
        __doc__.splitlines()[0], extra=[("--path", {"choices": ("wrapper", "hf-flex"), "default": "wrapper"})]
    )
    hf = args.path == "hf-flex"
    config, drafter, step = drafter_step(args, "hf-flex-path" if hf else None)
    plain = torch.compile(flex_attention)
    namer = ModuleNamer()
    dense = DenseFlexRecorder(measure_memory=True)
    interface = HFAttentionRecorder(None, dense, namer)  # entered again for every traced sample
    with ExitStack() as tracing:
        tracing.enter_context(dense)
        tracing.enter_context(interface)
        recorder = tracing.enter_context(FlexCallRecorder(dense, namer))
        traced = torch.compile(flex_attention)  # a recording wrapper, as trace-attention gives user code
        if not hf:
            use(drafter, traced)
        for _ in range(3):
            step()
    if not hf:
        use(drafter, plain)
    for _ in range(3):
        step()

    def timed(mode: str) -> float:
        with ExitStack() as tracing:
            if mode == "traced":
                for recorder_context in (dense, interface, recorder):
                    tracing.enter_context(recorder_context)
            if not hf:
                use(drafter, traced if mode == "traced" else plain)
            return seconds_per_step(step, args.steps, args.device)

    times = abba(timed, "traced", args.repeats)
    if dense.events:
        raise SystemExit(f"the benchmark step ran {len(dense.events)} dense flex kernels: not a fused step")
    calls = sum(site.calls for site in recorder.sites.values()) + sum(s.calls for s in interface.sites.values())
    print(describe(args, config) + f", path {args.path}")
    samples = f"{args.repeats} repeats x 2 samples x {args.steps} steps per mode"
    print(f"{samples}; {calls} attention calls recorded while traced")
    print_ratio(times, "traced", "traced")


if __name__ == "__main__":
    main()
