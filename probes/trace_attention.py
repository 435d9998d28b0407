"""Probe: where does attention run, through which implementation or wrapper, fused or dense?

Up to three parts, each traced with the dense-path hook on:
- a model built from its config with random weights, asking transformers for flex_attention (a
  class that refuses it is recorded and rebuilt with its default), run for `steps` training steps
  with the attention-interface recorder and module hooks;
- one reference DFlash drafter step with its fault switch;
- the user's script, run as __main__, with the attention-interface recorder and the recorder of
  the script's own flex_attention references.
It reports each attention layer, each call site, dense kernel runs and graph breaks. Afterwards,
each site that ran dense has one of its recorded calls replayed through a fresh
torch.compile(flex_attention) (hooks/fix_replay.py): the fix, proven on the user's own call or not.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
import traceback
import types
from collections.abc import Callable
from importlib import metadata
from typing import Any

import torch

from dflashdoctor import probe_support
from dflashdoctor.fla_guards import FlaGuard, fla_kept_out, fla_state, fla_unusable_on, refusing_guard
from dflashdoctor.hooks.dynamo_watch import DynamoWatch
from dflashdoctor.hooks.fix_replay import FixReplay
from dflashdoctor.hooks.flex_calls import FlexCallRecorder
from dflashdoctor.hooks.flex_dense import DenseFlexRecorder
from dflashdoctor.hooks.hf_attention import TORCH_FALLBACK, HFAttentionRecorder
from dflashdoctor.hooks.module_names import ModuleNamer
from dflashdoctor.models import build_config, drafter_dimensions, is_frozen_target
from dflashdoctor.observations import TraceAttentionObservations, dump
from dflashdoctor.probe_configs import TraceAttentionConfig
from dflashdoctor.probe_support import UsageError, probe_main, resolve_device
from dflashdoctor.redaction import redact_text
from dflashdoctor.reference.drafter_step import BLOCK_SIZE, make_drafter_step
from dflashdoctor.targets import unbound_problem

_WANTED = "flex_attention"
_MIN_DRAFT_BLOCKS = 8  # 128 draft tokens
_GRADIENT_ROOM = 1.25  # gradients as large as the weights, plus a quarter for activations


def _scale(config: TraceAttentionConfig, device: str) -> str:
    return config.scale if config.scale != "auto" else ("full" if device == "cuda" else "tiny")


def _bind_transformers_first() -> None:
    """transformers binds flex_attention at import: import it before the flex-call recorder's
    stand-in is in place, so that it holds the real function (its path has its own recorder)."""
    with contextlib.suppress(ImportError):
        importlib.import_module("transformers.integrations.flex_attention")


def _build(make_config: Callable[[], Any], device: str, dtype: torch.dtype) -> tuple[torch.nn.Module, str | None]:
    """The model with flex_attention if its class takes it; else its default, and the refusal.

    A refused attn_implementation stays on the config object, so the fallback gets a fresh config.
    """
    from transformers import AutoModelForCausalLM

    with torch.device(device):  # initialise on the device: a full-size model is slow to build on the CPU
        try:
            model = AutoModelForCausalLM.from_config(make_config(), attn_implementation=_WANTED, dtype=dtype)
            refusal = None
        except ValueError as exc:
            refusal = str(exc).split(". ")[0]
            model = AutoModelForCausalLM.from_config(make_config(), dtype=dtype)
    return model, refusal


def _why_no_backward(model: torch.nn.Module, device: str, impl: str) -> str | None:
    """Why the model's backward cannot run here, or None when it can.

    flex_attention has no CPU backward (and refuses even a forward whose inputs require grad). On a
    GPU, gradients take as much memory as the weights again: a full-size target may not fit twice.
    """
    if device == "cpu" and impl == _WANTED:
        return "flex_attention has no backward on the CPU"
    if device != "cuda":
        return None
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    free, _ = torch.cuda.mem_get_info()
    if weights * _GRADIENT_ROOM > free:
        return (
            f"gradients of {weights / 2**30:.1f} GiB would not fit beside the weights "
            f"({free / 2**30:.1f} GiB free on the GPU): forward only"
        )
    return None


def _trace_model(
    config: TraceAttentionConfig, spec: str, device: str, dense: DenseFlexRecorder, namer: ModuleNamer
) -> dict[str, Any]:
    """`spec` (config.model, set): the preset, config.json or model folder traced."""
    scale = _scale(config, device)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    fla = fla_state(device)
    # where FLA's kernels cannot run, the layers are built on transformers' torch fallback; the report says so
    with fla_kept_out(when=fla is not None and not fla["usable"]):
        model, refusal = _build(lambda: build_config(spec, scale), device, dtype)
    model_config = model.config
    impl = model_config._attn_implementation
    asked = config.backward
    if asked is False or (asked is None and is_frozen_target(spec)):
        no_backward: str | None = "not asked for" if asked is False else "a frozen target: as in DFlash training"
    elif config.drafter:
        no_backward = "the target of a drafter is frozen: forward under no_grad, as in DFlash training"
    else:
        no_backward = _why_no_backward(model, device, impl)
    backward = no_backward is None
    model.train(backward)
    namer.add_root(model)
    seq_len = config.seq_len
    generator = torch.Generator().manual_seed(0)
    error = refused = None
    stage = "the first step"
    with HFAttentionRecorder(model, dense, namer) as recorder:
        try:
            for step in range(config.steps):
                dense.phase = f"model:step{step}"
                stage = f"the forward of step {step}"
                ids = torch.randint(0, model_config.vocab_size, (1, seq_len), generator=generator).to(device)
                with torch.set_grad_enabled(backward):
                    out = model(input_ids=ids, labels=ids)
                    if backward:
                        stage = f"the backward of step {step}"
                        out.loss.backward()
        except Exception as exc:  # kept with the layers and sites seen so far
            guard = refusing_guard(exc, [FlaGuard(**g) for g in fla["guards"]]) if fla else None
            if guard is not None:  # FLA's own refusal of this machine: the environment, not the model
                refused = {"guard": guard.to_dict(), "stage": stage, "error": _error_record(exc)}
            else:
                error = _error_record(exc)
    return {
        "error": error,
        "fla_refused": refused,
        "fla": fla,
        "no_backward": no_backward,
        "model": spec,
        "scale": scale,
        "model_class": type(model).__name__,
        "model_type": model_config.model_type,
        "attn_implementation": impl,
        "flex_refused": refusal,
        "backward": backward,
        "seq_len": seq_len,
        "parameters": sum(p.numel() for p in model.parameters()),
        "layers": recorder.layers(),
        "sites": [site.to_dict() for site in recorder.sites.values()],
        "hook_unavailable": recorder.unavailable,
    }


def _error_record(exc: BaseException) -> dict[str, Any]:
    if isinstance(exc, SystemExit):
        return {"type": "SystemExit", "message": f"exit status {exc.code}", "traceback": ""}
    trace = redact_text("".join(traceback.format_exception(exc)))[-4000:]  # a secret it quotes: in no report
    return {"type": type(exc).__name__, "message": redact_text(str(exc))[:2000], "traceback": trace}


def _run_script(path: str, args: list[str]) -> tuple[dict[str, Any], BaseException | None]:
    """Run the user's script as __main__; its globals, and the exception it ended with, if any (a
    SystemExit with a status other than 0).

    The namespace is ours, so the globals (and the wrappers bound in them) survive a script that
    raises; sys.argv, sys.path and sys.modules["__main__"] are restored afterwards.
    """
    try:
        with open(path, "rb") as handle:  # bytes: compile reads the file's own coding declaration
            code = compile(handle.read(), path, "exec")
    except OSError as exc:
        raise UsageError(f"cannot read script {path}: {exc.strerror}") from exc
    except SyntaxError as exc:
        raise UsageError(f"syntax error in {exc.filename}:{exc.lineno}: {exc.msg}") from exc
    module = types.ModuleType("__main__")
    module.__file__ = path
    saved = sys.argv, list(sys.path), sys.modules.get("__main__")
    sys.argv = [path, *args]
    sys.path.insert(0, os.path.dirname(path))
    sys.modules["__main__"] = module
    error: BaseException | None = None
    try:
        exec(code, module.__dict__)
    except SystemExit as exc:
        if exc.code not in (0, None):
            error = exc
    except Exception as exc:
        error = exc
    finally:
        sys.argv, sys.path[:] = saved[0], saved[1]
        if saved[2] is not None:
            sys.modules["__main__"] = saved[2]
    return module.__dict__, error


def _trace_script(script: str, args: list[str], dense: DenseFlexRecorder, namer: ModuleNamer) -> dict[str, Any]:
    """The user's script run with `args`, with every transformers model it builds listed and hooked
    as it is built.

    Where FLA's kernels cannot run (its platform decides: the script picks its own device), FLA is
    kept from importing for the whole script, as for a preset, so that its models bind transformers'
    torch fallback; the report says so where it mattered.
    """
    path = os.path.abspath(script)
    _bind_transformers_first()
    dense.phase = "script"
    keep_out = fla_unusable_on("cuda")
    with (
        fla_kept_out(when=keep_out),
        HFAttentionRecorder(None, dense, namer) as hf,
        FlexCallRecorder(dense, namer, watch_exec=True) as flex,
    ):
        flex.seen_by_interface = hf.in_interface_call
        namespace, exc = _run_script(path, args)
    flex.name_wrappers({path: namespace})
    layers = hf.layers()
    stopped_import = _fla_import_stopped(exc) if keep_out else None
    fell_back = keep_out and any(layer["configured"] == TORCH_FALLBACK for layer in layers)
    # FLA's state (its guards cost half a second to read) only where it explains something
    fla = fla_state() if stopped_import or fell_back or isinstance(exc, RuntimeError) else None
    guard = refusing_guard(exc, [FlaGuard(**g) for g in fla["guards"]]) if fla and exc else None
    return {
        "script": path,
        "error": _error_record(exc) if exc is not None else None,
        "fla": fla if stopped_import or fell_back or guard else None,
        "fla_import_stopped": stopped_import,
        "fla_refused": {"guard": guard.to_dict(), "stage": "the script part"} if guard else None,
        "layers": layers,
        "sites": [site.to_dict() for site in hf.sites.values()],
        "flex_sites": [site.to_dict() for site in flex.sites.values()],
        "compile_calls": flex.compile_calls,
        "hook_unavailable": hf.unavailable,
    }


def _fla_import_stopped(exc: BaseException | None) -> dict[str, Any] | None:
    """Where the script's own import of FLA met the keep-out (transformers catches its own): the
    innermost frame outside the import machinery, and the statement there."""
    if not isinstance(exc, ImportError) or (exc.name or "").split(".")[0] != "fla":
        return None
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not f.filename.startswith("<frozen")]
    last = frames[-1] if frames else None
    return {
        "module": exc.name,
        "file": last.filename if last else None,
        "line": last.lineno if last else None,
        "function": last.name if last else None,
        "statement": last.line if last else None,
    }


def _trace_drafter(
    config: TraceAttentionConfig, device: str, dense: DenseFlexRecorder, namer: ModuleNamer
) -> dict[str, Any]:
    """`steps` reference DFlash drafter steps, with its fault switch, shaped like the qwen27b-dflash preset."""
    scale = _scale(config, device)
    dimensions = drafter_dimensions("qwen27b-dflash", scale)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    backward = config.backward is not False and device != "cpu"  # flex_attention has no CPU backward
    # The drafter reads the target's hidden states as context and drafts a quarter as many tokens, at
    # least 128: fewer queries take Inductor's flex-decoding kernel, which on torch 2.11 and an H200
    # has no valid config for a training call (NoValidChoicesError measured at 64 queries).
    context_len = config.seq_len
    blocks = max(_MIN_DRAFT_BLOCKS, context_len // (4 * BLOCK_SIZE))
    # Only the hf-flex-path fault calls into transformers: the other drafters leave it unimported
    # (on an H200 that import cost seconds of the gate's longest probe).
    through_hf = config.drafter_fault == "hf-flex-path" or "transformers" in sys.modules
    if through_hf:
        _bind_transformers_first()
    dense.phase = "drafter"
    error = None
    hf_recorder = HFAttentionRecorder(None, dense, namer) if through_hf else contextlib.nullcontext(None)
    with hf_recorder as hf, FlexCallRecorder(dense, namer) as flex:
        if hf is not None:
            flex.seen_by_interface = hf.in_interface_call
        try:
            _, step = make_drafter_step(
                dimensions, device, dtype, config.drafter_fault, backward, blocks=blocks, context_len=context_len
            )
            for _ in range(config.steps):
                step()
        except Exception as exc:  # kept as a finding with the sites seen so far
            error = _error_record(exc)
    flex.name_wrappers({})
    return {
        "error": error,
        "fault": config.drafter_fault,
        "scale": scale,
        "backward": backward,
        "q_len": blocks * BLOCK_SIZE,
        "context_len": context_len,
        "sites": [site.to_dict() for site in hf.sites.values()] if hf is not None else [],
        "flex_sites": [site.to_dict() for site in flex.sites.values()],
        "compile_calls": flex.compile_calls,
        "hook_unavailable": hf.unavailable if hf is not None else None,
    }


def run(config: TraceAttentionConfig) -> dict[str, Any]:
    device = resolve_device(config.device)
    if config.expect_wrapper:  # a wrapper that names nothing would fail every site, wrongly
        problem = unbound_problem(config.expect_wrapper)
        if problem:
            raise UsageError(f"--expect-wrapper {config.expect_wrapper}: {problem}")
    namer = ModuleNamer()
    dense = DenseFlexRecorder(skip_files=(__file__, probe_support.__file__), measure_memory=True, namer=namer)
    observations: dict[str, Any] = {
        "device": device,
        "torch": torch.__version__,
        "python": sys.version.split()[0],
        "transformers": _transformers_version(),
        "expect_wrapper": config.expect_wrapper,
    }
    watch = DynamoWatch()  # graph breaks in the traced run: the recorders must add none
    replay = FixReplay(dense)  # each dense site's first call, kept to be replayed through the fix
    with dense:
        with replay:
            if config.model:
                observations["traced_model"] = _trace_model(config, config.model, device, dense, namer)
            if config.drafter:
                observations["traced_drafter"] = _trace_drafter(config, device, dense, namer)
            if config.script:
                observations["traced_script"] = _trace_script(config.script, config.script_args, dense, namer)
        # the traced run's compiles and breaks, before the replay compiles anything of its own
        observations["compiles"] = watch.collect("traced")  # recompile-limit and skipped-frame causes
        observations["graph_breaks"] = dict(watch.graph_breaks)
        observations["graph_break_sites"] = watch.graph_break_sites  # each break's reason and line
        # its dense kernels stay in dense_events under their own phase (records.FIX_REPLAY_PHASE)
        observations["fix_replays"] = replay.replay()
    observations["dynamo_disabled"] = bool(getattr(torch._dynamo.config, "disable", False))
    observations["dense_events"] = [e.to_dict() for e in dense.events]
    observations["hook_unavailable"] = dense.unavailable
    return dump(TraceAttentionObservations(**observations))


def _transformers_version() -> str | None:
    """From package metadata: importing transformers only for its version cost seconds."""
    try:
        return metadata.version("transformers")
    except metadata.PackageNotFoundError:
        return None


if __name__ == "__main__":
    probe_main(run, TraceAttentionConfig)
