"""Findings about flash-linear-attention (FLA) on this machine, one wording for trace-attention and
env: installed where its kernels cannot run, or refusing a kernel with a guard of its own (read from
the installed FLA by `dflashdoctor.fla_guards`)."""

from __future__ import annotations

import os
from typing import Any

from dflashdoctor.codes import finding
from dflashdoctor.report import Finding, Where


def why_fla_cannot_run(fla: dict[str, Any]) -> str:
    """Why FLA's kernels cannot run where it is installed, in a few words."""
    platform = fla["platform"]
    if platform.startswith("unavailable"):
        return f"FLA does not load here ({platform.removeprefix('unavailable: ')})"
    if platform != "cpu" and fla.get("device") == "cpu":
        return "the model runs on the CPU"
    return f"triton has no GPU backend here (FLA's platform: {platform})"


def fla_not_usable_finding(fla: dict[str, Any], *, traced: bool) -> Finding:
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
        evidence=fla,
        fix=fix,
    )


def _sentence(text: str) -> str:
    text = text.strip()
    return text if text.endswith((".", "!", "?")) else f"{text}."


def fla_guard_finding(guard: dict[str, Any], fla: dict[str, Any], *, during: str | None) -> Finding:
    """A platform guard of the installed FLA that refuses a kernel here: the versions and GPU it holds
    for, FLA's flags, and FLA's own advice as the fix."""
    flags = ", ".join(f"{name}={value}" for name, value in guard["flags"].items())
    when = f" when {' and '.join(guard['other_terms'])}" if guard["other_terms"] else ""
    machine = f"triton {fla.get('triton') or 'unknown'}" + (f" on {fla['gpu']}" if fla.get("gpu") else "")
    return finding(
        "kernel-unavailable",
        f"FLA {fla.get('version') or ''} refuses `{guard['function']}` on this machine{when}".replace("  ", " "),
        detail=f"FLA's own guard ({os.path.basename(guard['file'])}:{guard['line']}) holds for {machine} "
        f"({flags})."
        + (f" It stopped {during} of the trace; what ran before it is listed." if during else "")
        + " This is the installed versions and the GPU's architecture, not the model.",
        where=Where(file=guard["file"], line=guard["line"], function=guard["function"]),
        evidence={"guard": guard, "fla": {k: v for k, v in fla.items() if k != "guards"}},
        fix=f"FLA says: {_sentence(guard['message'])} If the model is not trained here, trace it forward only "
        "(the default for a frozen target).",
    )
