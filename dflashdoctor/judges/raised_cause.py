"""Why a traced script or target raised, read through the same evidence as a dense call: dynamo's
compile records and its own "from user code" stack, before "run it by hand".

A raise during a compiled step is often a known cause in another form: `fullgraph=True` turns a
graph break into an exception (transformers' create_block_mask(_compile=True) is one every HF model
compiled whole meets), automatic dynamic shapes turn a changing Python float in a score_mod into a
symbolic float that Inductor's flex lowering rejects, `fail_on_recompile_limit_hit` turns the
recompile-limit fallback into an error, and threads sharing an autotuner raise from inside triton.
Each is matched here and given the cause kind and fix the dense path would give; an error that
names none of them is told by what the records do show (the frame that failed to compile, and in
which stage), never a bare "run it by hand".
"""

from __future__ import annotations

import re

from dflashdoctor.judges.dense_cause import Cause, CompileCall, failed_compile, recompile_limit
from dflashdoctor.judges.dynamo_causes import is_library_file, is_recompile_limit
from dflashdoctor.judges.graph_breaks import read_break
from dflashdoctor.judges.known_causes import known_cause
from dflashdoctor.records import CompileRecord, ErrorRecord, TargetError
from dflashdoctor.report import Where

_USER_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<fn>\S+)\s*$', re.MULTILINE)
# dynamo re-raising an exception the traced code itself raised: the code's error, not a graph break
_OBSERVED = re.compile(r"^Observed exception|raised exception \w+\(", re.MULTILINE)
# the exception came out of torch's compile machinery or flex's own higher-order op
_INSIDE_COMPILE = re.compile(r"torch/(_dynamo|_inductor|_functorch|_higher_order_ops)/")
# torch's own file (a venv folder named torch is no such file)
_TORCH_FILE = re.compile(r"(site|dist)-packages/torch/|^(?!.*-packages/).*/torch/")


def _from_user_code(message: str) -> list[str]:
    """Dynamo's "from user code:" frames of an exception, outermost first, as `file:line in fn`."""
    _, found, tail = message.partition("from user code:")
    if not found:
        return []
    tail = tail.split("Set TORCHDYNAMO_VERBOSE", 1)[0].split("Traceback (most recent call last)", 1)[0]
    return [f"{m['file']}:{m['line']} in {m['fn']}" for m in _USER_FRAME.finditer(tail)]


def _failed_compile(error: ErrorRecord | TargetError, compiles: list[CompileRecord]) -> CompileRecord | None:
    """The last compile record that failed with this error's type."""
    kind = error.get("type")
    return next((r for r in reversed(compiles) if r.get("fail_type") and r.get("fail_type") == kind), None)


def explain_raised(
    error: ErrorRecord | TargetError,
    compiles: list[CompileRecord],
    compile_calls: list[CompileCall],
    known_file: str | None = None,
) -> Cause | None:
    """The cause of an exception a traced run ended with, when the evidence names one; None for an
    error that no compile record or known hazard speaks to (the script's own bug)."""
    message = str(error.get("message") or "")
    text = message + "\n" + str(error.get("traceback") or "")
    failed = _failed_compile(error, compiles)
    if "recompile limit" in message.lower() or (failed is not None and is_recompile_limit(failed)):
        limit = failed if failed is not None and is_recompile_limit(failed) else None  # raised with no record
        return recompile_limit(compiles, limit, compile_calls, known_file)
    if failed is not None and failed.get("recompile_reason"):
        float_cause = failed_compile(failed, "the step raised", known_file)
        if float_cause.kind == "changing-float":
            return float_cause
    recompiled = [r for r in compiles if r.get("recompile_reason")]
    if failed is None and recompiled and _INSIDE_COMPILE.search(text):
        # torch 2.11 on an H200: after a float's recompile, compiling flex's autograd raised an
        # AssertionError of its own with no compile record: the recompile that led there is the cause
        for record in reversed(recompiled):
            seen: CompileRecord = {**record, "fail_type": error.get("type"), "fail_reason": message[:300]}
            float_cause = failed_compile(seen, "the step raised", known_file)
            if float_cause.kind == "changing-float":
                return float_cause
    frames = _from_user_code(message) or _from_user_code(text)
    if frames and error.get("type") in ("Unsupported", "UserError") and not _OBSERVED.search(message):
        return _fullgraph_break(message, frames, compile_calls)
    hazard = known_cause(message, _innermost(text))
    if hazard is not None:
        return Cause(hazard.name, hazard.cause, hazard.fix)
    if failed is not None:
        return failed_compile(failed, "the step raised", known_file)
    return None


def _innermost(traceback_text: str) -> str:
    frames = list(_USER_FRAME.finditer(traceback_text))
    return frames[-1]["file"] if frames else ""


def _fullgraph_break(message: str, frames: list[str], compile_calls: list[CompileCall]) -> Cause:
    """A graph break that `fullgraph=True` (or torch.export) turned into an exception: read as the
    break it is, with the compile line that asked for one graph."""
    user = [f for f in frames if not is_library_file(f)]
    # as for a graph break: the innermost frame outside torch (a library's own line that called it)
    site = next((f for f in reversed(frames) if not _TORCH_FILE.search(f.replace("\\", "/"))), frames[-1])
    reading = read_break(message, site=site, stack=frames, entry=frames[0])
    full = next((c for c in compile_calls if c.fullgraph), None)
    at = f" `torch.compile({full.target}, fullgraph=True)` at {full.at}" if full else " fullgraph=True"
    summary = f"a graph break raised under{at}: {reading.plain}"
    if reading.hazard is not None:
        summary = f"{reading.title}; under{at} the graph break it makes is an error"
    fix = reading.fix
    if full is not None:
        fix += f" Or drop `fullgraph=True` at {full.at} to let dynamo break the graph there instead of raising."
    where = full.where if full is not None else (_where(user[-1]) if user else None)
    return Cause("fullgraph-break", summary, fix, where)


def _where(frame: str) -> Where | None:
    place = frame.split(" in ", 1)[0]
    file, _, line = place.rpartition(":")
    return Where(file=file, line=int(line)) if file and line.isdigit() else None
