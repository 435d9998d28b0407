"""A held-out DFlash drafter trainer, written here after SpecForge's (sgl-project/SpecForge,
`specforge/modeling/draft/dflash.py` and `dflash_mask.py` at 0354ed80): not the project's reference
drafter, so `run`'s cost is measured on a program the doctor was not shaped around.

What it keeps from SpecForge: Qwen3-style layers whose queries are the draft blocks and whose keys
and values are the target's context followed by the draft blocks; attention through transformers'
`compile_friendly_flex_attention` (its compiled singleton) with `enable_gqa=True`; a block mask made
eagerly every step with `create_block_mask` from a mask_mod closed over that step's anchor tensor
(each draft block sees the context before its anchor and its own block); forward, backward and
AdamW in bf16 (forward only on the CPU, where flex has no backward). Random weights, random data, no downloads.

    python3 benchmarks/held_out_drafter.py --device cuda            # hidden 2048, 4 layers, seq 4096
    python3 benchmarks/held_out_drafter.py --agent-at imports   # run's agent started after the imports

Prints `step N: loss L, T ms` per step (T timed inside the program, synchronised) and, last,
`median step ms: M` over the steps after `--warmup`. With `--agent-at imports` the program starts the
agent `dflashdoctor run` would have started, but after torch and transformers are imported; with
`--agent-at model`, after the drafter is built too, as the in-process benchmarks start it. Under
`dflashdoctor run` the agent starts before the first import.
`--profile-steps K` times K more steps under torch.profiler and prints the events per step.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention.flex_attention import BlockMask, create_block_mask
from transformers import Qwen3Config
from transformers.integrations.flex_attention import compile_friendly_flex_attention
from transformers.models.qwen3.modeling_qwen3 import Qwen3MLP, Qwen3PreTrainedModel, Qwen3RMSNorm

DRAFT_BLOCK = 16


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


class Qwen3DFlashAttention(nn.Module):
    """Queries from the draft blocks; keys and values from context then draft, per-head q/k norms."""

    def __init__(self, config: Qwen3Config) -> None:
        super().__init__()
        self.heads, self.kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = config.head_dim
        hidden = config.hidden_size
        self.q_proj = nn.Linear(hidden, self.heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(hidden, self.kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(hidden, self.kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.heads * self.head_dim, hidden, bias=False)
        self.q_norm = Qwen3RMSNorm(self.head_dim, eps=config.rms_norm_eps)
        self.k_norm = Qwen3RMSNorm(self.head_dim, eps=config.rms_norm_eps)
        self.scaling = self.head_dim**-0.5

    def forward(
        self, draft: torch.Tensor, context: torch.Tensor, rotary: tuple[torch.Tensor, torch.Tensor], mask: BlockMask
    ) -> torch.Tensor:
        batch, queries, _ = draft.shape
        both = torch.cat((context, draft), dim=1)
        q = self.q_norm(self.q_proj(draft).view(batch, queries, self.heads, self.head_dim)).transpose(1, 2)
        k = self.k_norm(self.k_proj(both).view(batch, both.shape[1], self.kv_heads, self.head_dim)).transpose(1, 2)
        v = self.v_proj(both).view(batch, both.shape[1], self.kv_heads, self.head_dim).transpose(1, 2)
        cos, sin = rotary
        q = q * cos[-queries:] + _rotate_half(q) * sin[-queries:]
        k = k * cos + _rotate_half(k) * sin
        out = compile_friendly_flex_attention(q, k, v, block_mask=mask, enable_gqa=True, scale=self.scaling)
        return self.o_proj(out.transpose(1, 2).reshape(batch, queries, -1))


class Qwen3DFlashLayer(nn.Module):
    def __init__(self, config: Qwen3Config) -> None:
        super().__init__()
        self.input_layernorm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.self_attn = Qwen3DFlashAttention(config)
        self.post_attention_layernorm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.mlp = Qwen3MLP(config)

    def forward(
        self, draft: torch.Tensor, context: torch.Tensor, rotary: tuple[torch.Tensor, torch.Tensor], mask: BlockMask
    ) -> torch.Tensor:
        draft = draft + self.self_attn(self.input_layernorm(draft), context, rotary, mask)
        return draft + self.mlp(self.post_attention_layernorm(draft))


class DFlashDrafter(Qwen3PreTrainedModel):
    """A transformers model, as SpecForge's drafter is (so a recorder watching transformers models
    being built adopts it): the target's hidden states of a few layers, concatenated, are projected
    to the drafter's width and serve as context for every layer; embedding and head are frozen."""

    def __init__(self, config: Qwen3Config, target_layers: int) -> None:
        super().__init__(config)
        hidden = config.hidden_size
        self.embed_tokens = nn.Embedding(config.vocab_size, hidden).requires_grad_(False)
        self.fc = nn.Linear(target_layers * hidden, hidden, bias=False)
        self.hidden_norm = Qwen3RMSNorm(hidden, eps=config.rms_norm_eps)
        self.layers = nn.ModuleList(Qwen3DFlashLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = Qwen3RMSNorm(hidden, eps=config.rms_norm_eps)
        self.lm_head = nn.Linear(hidden, config.vocab_size, bias=False).requires_grad_(False)
        head_dim = config.head_dim
        inverse = 1.0 / (10000 ** (torch.arange(0, head_dim, 2).float() / head_dim))
        self.register_buffer("inverse_frequency", inverse, persistent=False)
        self.post_init()

    def rotary(self, length: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        angles = torch.outer(torch.arange(length, device=self.inverse_frequency.device).float(), self.inverse_frequency)
        angles = torch.cat((angles, angles), dim=-1)
        return angles.cos().to(dtype), angles.sin().to(dtype)

    def forward(self, draft_tokens: torch.Tensor, target_hidden: torch.Tensor, mask: BlockMask) -> torch.Tensor:
        context = self.hidden_norm(self.fc(target_hidden))
        draft = self.embed_tokens(draft_tokens)
        rotary = self.rotary(context.shape[1] + draft.shape[1], draft.dtype)
        for layer in self.layers:
            draft = layer(draft, context, rotary, mask)
        return self.lm_head(self.norm(draft))


def dflash_block_mask(anchors: torch.Tensor, context: int, device: str) -> BlockMask:
    """Each draft block sees the context strictly before its anchor and the whole of its own block."""
    blocks = anchors.shape[1]

    def mask_mod(b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor) -> torch.Tensor:
        block = q_idx // DRAFT_BLOCK
        sees_context = (kv_idx < context) & (kv_idx < anchors[b, block])
        sees_own_block = (kv_idx >= context) & ((kv_idx - context) // DRAFT_BLOCK == block)
        return sees_context | sees_own_block

    queries = blocks * DRAFT_BLOCK
    return create_block_mask(
        mask_mod, B=anchors.shape[0], H=None, Q_LEN=queries, KV_LEN=context + queries, device=device
    )


def _options() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--intermediate", type=int, default=6144)
    parser.add_argument("--vocab", type=int, default=32768)
    parser.add_argument("--target-layers", type=int, default=5, help="target layers whose hidden states are context")
    parser.add_argument("--context", type=int, default=4096, help="target tokens the drafter sees")
    parser.add_argument("--blocks", type=int, default=64, help="draft blocks of 16 tokens per sequence")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=8, help="steps left out of the median (compilation)")
    parser.add_argument("--profile-steps", type=int, default=0)
    parser.add_argument(
        "--compile-model",
        metavar="BACKEND",
        help="compile the whole drafter with this backend (inductor; aot_eager is the faulty twin: "
        "inside it transformers hands the raw flex_attention to the model's graph)",
    )
    parser.add_argument(
        "--inputs",
        choices=("host", "device"),
        default="host",
        help="where each step's random inputs are drawn: host (the CPU, then copied: a host-bound step) "
        "or device (as a trainer whose target model runs on the GPU has them)",
    )
    parser.add_argument(
        "--lockstep",
        metavar="PREFIX",
        help="take each step only when PREFIX.go gives a byte, and give one to PREFIX.done after it "
        "(FIFOs: a benchmark alternates the steps of two processes in time)",
    )
    parser.add_argument(
        "--agent-at",
        choices=("imports", "model"),
        help="start run's agent here, after the imports or after the model is built (not under run)",
    )
    return parser.parse_args()


def _start_agent(folder: str) -> None:
    """The agent `run` starts in each process, started here, late: torch and transformers loaded."""
    from dflashdoctor.agent.config import RunSettings
    from dflashdoctor.agent.process import ProcessAgent

    ProcessAgent(folder, RunSettings()).start()


def main() -> None:
    args = _options()
    with tempfile.TemporaryDirectory(prefix="held-out-drafter-agent-") as folder:
        if args.agent_at == "imports":
            _start_agent(folder)
        train(args, folder)


def train(args: argparse.Namespace, folder: str) -> None:
    cuda = args.device == "cuda"
    dtype = torch.bfloat16 if cuda else torch.float32
    torch.manual_seed(0)
    config = Qwen3Config(
        hidden_size=args.hidden,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        head_dim=args.head_dim,
        intermediate_size=args.intermediate,
        vocab_size=args.vocab,
        attn_implementation="flex_attention",
    )
    drafter = DFlashDrafter(config, args.target_layers).to(args.device, dtype)
    if args.compile_model:
        drafter = torch.compile(drafter, backend=args.compile_model)
    if args.agent_at == "model":
        _start_agent(folder)
    optimizer = torch.optim.AdamW([p for p in drafter.parameters() if p.requires_grad], lr=1e-5)
    drawn_on = args.device if args.inputs == "device" else "cpu"
    generator = torch.Generator(drawn_on).manual_seed(1)

    def step() -> float:
        anchors = torch.randint(1, args.context, (1, args.blocks), generator=generator, device=drawn_on)
        mask = dflash_block_mask(anchors.sort(dim=1).values.to(args.device), args.context, args.device)
        hidden_shape = (1, args.context, args.target_layers * args.hidden)
        target_hidden = torch.randn(hidden_shape, generator=generator, device=drawn_on).to(args.device, dtype)
        tokens = (1, args.blocks * DRAFT_BLOCK)
        draft_tokens = torch.randint(0, args.vocab, tokens, generator=generator, device=drawn_on).to(args.device)
        labels = torch.randint(0, args.vocab, tokens, generator=generator, device=drawn_on).to(args.device)
        with torch.enable_grad() if cuda else torch.no_grad():  # flex has no backward on the CPU
            logits = drafter(draft_tokens, target_hidden, mask)
            loss = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten())
        if cuda:
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        return float(loss.detach())

    times = []
    turns = _Lockstep(args.lockstep) if args.lockstep else None
    for index in range(args.steps):
        if cuda:
            torch.cuda.synchronize()
        if turns is not None:
            turns.wait()
        started = time.perf_counter()
        loss = step()
        if cuda:
            torch.cuda.synchronize()
        elapsed_ms = (time.perf_counter() - started) * 1e3
        if turns is not None:
            turns.done()
        print(f"step {index}: loss {loss:.4f}, {elapsed_ms:.2f} ms", flush=True)
        if index >= args.warmup:
            times.append(elapsed_ms)
    print(f"median step ms: {statistics.median(times):.3f}", flush=True)
    if args.profile_steps:
        _profiled(step, args.profile_steps, cuda)


class _Lockstep:
    """Steps taken in turn with another process: a byte from PREFIX.go lets one step run, a byte to
    PREFIX.done says it ended (the benchmark holds the other ends)."""

    def __init__(self, prefix: str) -> None:
        self._go = open(f"{prefix}.go", "rb", buffering=0)  # noqa: SIM115 - held for the whole run
        self._done = open(f"{prefix}.done", "wb", buffering=0)  # noqa: SIM115

    def wait(self) -> None:
        if not self._go.read(1):
            raise SystemExit("lockstep: the benchmark went away")

    def done(self) -> None:
        self._done.write(b".")


def _profiled(step: object, steps: int, cuda: bool) -> None:
    """Step time under torch.profiler and what it saw per step: a program whose steps run more
    host-side ops pays the profiler's cost per op, so a ratio under the profiler magnifies them."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        started = time.perf_counter()
        for _ in range(steps):
            step()  # type: ignore[operator]
        if cuda:
            torch.cuda.synchronize()
        elapsed_ms = (time.perf_counter() - started) * 1e3 / steps
    averages = prof.key_averages()
    events = sum(a.count for a in averages)
    print(f"profiled step ms: {elapsed_ms:.3f}; profiler events per step: {events / steps:.1f}", flush=True)
    top = sorted(averages, key=lambda a: a.count, reverse=True)[:12]
    for average in top:
        cpu_ms = average.cpu_time_total / steps / 1e3
        print(f"  op {average.key}: {average.count / steps:.1f} per step, cpu {cpu_ms:.3f} ms", flush=True)


if __name__ == "__main__":
    main()
