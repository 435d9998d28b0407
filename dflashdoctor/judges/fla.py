"""Findings about flash-linear-attention (FLA) on this machine, one wording for trace-attention and
env: installed where its kernels cannot run, or refusing a kernel with a guard of its own (read from
the installed FLA by `dflashdoctor.fla_guards`)."""

from __future__ import annotations

import os

from dflashdoctor.codes import finding
from dflashdoctor.records import FlaGuardRecord, FlaState, ImportStopped
from dflashdoctor.report import Finding, Where


def why_fla_cannot_run(fla: FlaState) -> str:
    """Why FLA's kernels cannot run where it is installed, in a few words."""
    platform = fla["platform"]
    if platform.startswith("unavailable"):
        return f"FLA does not load here ({platform.removeprefix('unavailable: ')})"
    if platform != "cpu" and fla.get("device") == "cpu":
        return "the model runs on the CPU"
    return f"triton has no GPU backend here (FLA's platform: {platform})"


def fla_not_usable_finding(fla: FlaState, *, traced: bool) -> Finding:
    """FLA installed where its kernels cannot run: one wording for trace-attention and env."""
    where = "on the CPU" if fla.get("device") == "cpu" else "here"
    why = why_fla_cannot_run(fla)
    if fla["platform"].startswith("unavailable"):  # transformers falls back by itself
        detail = f"{why}, so transformers runs its torch fallback for the gated DeltaNet layers."
        fix = (
            "Repair the FLA install so that `import fla.utils` succeeds (the error above); until then those layers "
            "run transformers' torch code, far slower than FLA's kernels."
        )
    else:
        detail = (
            "transformers binds FLA's kernels to the gated DeltaNet (linear-attention) layers whenever FLA "
            f"imports, and they cannot run: {why}, so the first such layer fails (`0 active drivers`)."
        )
        fix = (
            "Expected on a CPU machine: on the GPU node those layers run FLA's kernels. To run FLA's kernels here "
            "you need a GPU that triton supports; to use the fallback in your own CPU runs, uninstall fla-core there."
        )
    if traced:
        detail += (
            " This trace kept FLA from importing, so those layers ran transformers' torch fallback; the layers "
            "table shows the implementation each layer really ran."
        )
    return finding(
        "kernel-unavailable",
        f"FLA {fla.get('version') or ''} is installed but its kernels cannot run {where}".replace("  ", " "),
        detail=detail,
        evidence=dict(fla),
        fix=fix,
    )


def fla_import_stopped_finding(stopped: ImportStopped, fla: FlaState) -> Finding:
    """A traced script whose own import of FLA met the keep-out: the trace keeps FLA from importing
    where its kernels cannot run, so that transformers binds its torch fallback, and an import by the
    user's code then fails there. Said as what happened, with the line, not as the script's failure."""
    where = "on the CPU" if fla.get("device") == "cpu" else "here"
    statement = f"`{stopped['statement']}`" if stopped.get("statement") else f"an import of `{stopped['module']}`"
    at = f" ({stopped['file']}:{stopped['line']})" if stopped.get("file") else ""
    loads = not fla["platform"].startswith("unavailable")  # a broken FLA fails at the import anyway
    title = f"The script imports FLA itself, and FLA {fla.get('version') or ''} cannot run its kernels {where}"
    return finding(
        "kernel-unavailable",
        title.replace("  ", " "),
        detail=f"{statement}{at} failed because this trace kept FLA from importing: {why_fla_cannot_run(fla)}."
        + (" Left to import, FLA's kernels would fail at their first call (`0 active drivers`)." if loads else "")
        + " Kept out, FLA leaves transformers to bind its torch fallback to the gated DeltaNet layers, as a "
        "preset's trace does; an import of FLA by your own code has nothing to fall back on, so the script was "
        "traced up to that import only. The layers and call sites seen before it are listed.",
        where=Where(file=stopped.get("file"), line=stopped.get("line"), function=stopped.get("function")),
        evidence={"import": stopped, "fla": {k: v for k, v in fla.items() if k != "guards"}},
        fix="Trace this script on the GPU node, where FLA's kernels run. To trace it on this machine, import FLA "
        "only where its kernels can run (for example behind `torch.cuda.is_available()`) and let transformers "
        "choose the layers' kernels.",
    )


def _sentence(text: str) -> str:
    text = text.strip()
    return text if text.endswith((".", "!", "?")) else f"{text}."


def fla_guard_finding(guard: FlaGuardRecord, fla: FlaState | None, *, during: str | None) -> Finding:
    """A platform guard of the installed FLA that refuses a kernel here: the versions and GPU it holds
    for, FLA's flags, and FLA's own advice as the fix. `fla` None: the probe read no FLA state."""
    flags = ", ".join(f"{name}={value}" for name, value in guard["flags"].items())
    when = f" when {' and '.join(guard['other_terms'])}" if guard["other_terms"] else ""
    triton, gpu, version = (fla["triton"], fla["gpu"], fla["version"]) if fla else (None, None, None)
    machine = f"triton {triton or 'unknown'}" + (f" on {gpu}" if gpu else "")
    return finding(
        "kernel-unavailable",
        f"FLA {version or ''} refuses `{guard['function']}` on this machine{when}".replace("  ", " "),
        detail=f"FLA's own guard ({os.path.basename(guard['file'])}:{guard['line']}) holds for {machine} "
        f"({flags})."
        + (f" It stopped {during} of the trace; what ran before it is listed." if during else "")
        + " This is the installed versions and the GPU's architecture, not the model.",
        where=Where(file=guard["file"], line=guard["line"], function=guard["function"]),
        evidence={"guard": guard, "fla": {k: v for k, v in (fla or {}).items() if k != "guards"}},
        fix=f"FLA says: {_sentence(guard['message'])} If the model is not trained here, trace it forward only "
        "(the default for a frozen target).",
    )
