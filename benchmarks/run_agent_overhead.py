"""What `dflashdoctor run`'s agent costs a compiled drafter training step (forward, backward, AdamW),
resolved by alternating plain and instrumented samples in one process.

    python benchmarks/run_agent_overhead.py --device cuda --path hf-flex --repeats 15 --context 4096 --blocks 128
    python benchmarks/run_agent_overhead.py --device cpu --repeats 3   # forward only, tiny scale

Instrumented: the agent `run` loads into each process, started as the bootstrap starts it
(`ProcessAgent.start`: its event log on disk, exception hooks, stack sampler, and the torch
instruments: dense-kernel, flex-call and attention-interface recorders, the dynamo watch, the
autotuner guard, the optimizer-step hook that writes coalesced step records and snapshots). Plain:
the same process with the agent's recorders exited and torch's global optimizer-step hooks set
aside, so each plain step runs none of the agent's per-call or per-step code; only its sampler
thread, which wakes once a second, runs in both. The agent loads here after torch, the drafter
and (on the hf-flex path) transformers are imported, so its recorders are entered on modules already
loaded, as trace-attention's are; a user wrapper (`--path wrapper`) is compiled with the recorder
active, as a program that imports flex_attention under `run` compiles it.

Before timing, 120 instrumented steps (the agent writes a record for each of the first 100 steps,
then one every 5 s). Each repeat times `--steps` steps in the order plain, instrumented,
instrumented, plain; the figure is the median per-step time of each mode over all samples, their
ratio, and a 95% bootstrap interval of it.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator

import torch
import torch.nn.attention.flex_attention as flex_module
import torch.optim.optimizer as optimizer_module
from drafter_bench import abba, describe, drafter_options, drafter_step, print_ratio, seconds_per_step, use

from dflashdoctor.agent.config import RunSettings
from dflashdoctor.agent.process import ProcessAgent
from dflashdoctor.agent.torch_instruments import TorchInstruments

_SETTLE_STEPS = 120


@contextlib.contextmanager
def suspended(instruments: TorchInstruments) -> Iterator[None]:
    """The agent's per-call and per-step code out of the way, put back as it was afterwards."""
    hooks = optimizer_module._global_optimizer_post_hooks
    saved = dict(hooks)
    recorders = [r for r in (instruments.hf, instruments.flex, instruments.dense) if r is not None]
    hooks.clear()
    for recorder in recorders:  # the last entered first
        recorder.__exit__(None, None, None)
    try:
        yield
    finally:
        for recorder in reversed(recorders):
            recorder.__enter__()
        hooks.update(saved)


def main() -> None:
    args = drafter_options(
        __doc__.splitlines()[0], extra=[("--path", {"choices": ("wrapper", "hf-flex"), "default": "hf-flex"})]
    )
    hf = args.path == "hf-flex"
    config, drafter, forward_backward = drafter_step(args, "hf-flex-path" if hf else None)
    optimizer = torch.optim.AdamW(drafter.parameters(), lr=1e-5)

    def step() -> None:
        forward_backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    plain = torch.compile(flex_module.flex_attention)
    with tempfile.TemporaryDirectory(prefix="dflashdoctor-agent-bench-") as events:
        agent = ProcessAgent(events, RunSettings())
        agent.start()
        instruments = agent.torch
        if not isinstance(instruments, TorchInstruments) or instruments.flex is None:
            raise SystemExit(f"the agent did not instrument torch here: {instruments and instruments.unavailable}")
        instrumented = torch.compile(flex_module.flex_attention)  # the recording stand-in, compiled
        for _ in range(_SETTLE_STEPS if args.device == "cuda" else 3):  # instrumented
            if not hf:
                use(drafter, instrumented)
            step()

        def timed(mode: str) -> float:
            if not hf:
                use(drafter, instrumented if mode == "instrumented" else plain)
            with suspended(instruments) if mode == "plain" else contextlib.nullcontext():
                return seconds_per_step(step, args.steps, args.device)

        times = abba(timed, "instrumented", args.repeats)
        if instruments.dense_seen:
            raise SystemExit(f"the benchmark step ran {instruments.dense_seen} dense flex kernels: not a fused step")
        settle = _SETTLE_STEPS if args.device == "cuda" else 3
        if instruments.steps != settle + 2 * args.repeats * args.steps:  # each mode ran what it says
            raise SystemExit(f"the agent saw {instruments.steps} optimizer steps, not only the instrumented ones")
    print(describe(args, config) + f", path {args.path}, AdamW")
    print(f"{args.repeats} repeats x 2 samples x {args.steps} steps per mode, after {settle} instrumented steps")
    print_ratio(times, "instrumented", "run")


if __name__ == "__main__":
    main()
