"""The installed FLA's own platform guards, read from its source and evaluated with its own flags; a
refusal raised by FLA matched to its guard; env on a CPU machine and on a GPU with FLA. All but the
parser's test need fla-core (the fla extra), which the test command installs."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
import torch

from dflashdoctor.fla_guards import FlaGuard, fla_flags, fla_folder, fla_guards

needs_fla = pytest.mark.skipif(fla_folder() is None, reason="needs fla-core (the fla extra)")

HOPPER_WITH_TRITON_3_6 = {"IS_NVIDIA_HOPPER": True, "TRITON_ABOVE_3_4_0": True, "TRITON_ABOVE_3_7_1": False}


GUARDS = """
# one of FLA's ops modules, in miniature

def outer(g):
    if IS_NVIDIA_HOPPER and not TRITON_ABOVE_3_7_1 and g is not None:
        raise RuntimeError("refused on " "Hopper")

    def inner():
        if IS_AMD:
            raise RuntimeError("inner refusal")

    if g is None:  # no flag: not a platform guard
        raise RuntimeError("g is needed")
    if IS_NVIDIA_HOPPER:
        raise RuntimeError(f"a formatted message {g}")  # not a constant: not read
    if IS_NVIDIA_HOPPER:
        raise ValueError("another exception type")
"""


def test_guards_are_read_from_source_as_written(tmp_path):
    """Flags and their negation, the call's other terms, nested functions (each guard once, in its own
    function); conditions without a flag, non-constant messages and other exception types are no guards."""
    from dflashdoctor.fla_guards import _guards_in

    path = tmp_path / "ops.py"
    path.write_text(GUARDS)
    on_hopper = {"IS_NVIDIA_HOPPER": True, "TRITON_ABOVE_3_7_1": False}
    hopper, inner = _guards_in(str(path), on_hopper)
    assert (hopper.function, hopper.line, hopper.message) == ("outer", 6, "refused on Hopper")
    assert hopper.flags == on_hopper and hopper.other_terms == ["g is not None"] and hopper.applies
    assert (inner.function, inner.line, inner.applies) == ("inner", 10, False)  # IS_AMD not set here
    assert not _guards_in(str(path), on_hopper | {"TRITON_ABOVE_3_7_1": True})[0].applies
    path.write_bytes(b"\xff\xfe raise RuntimeError")  # not UTF-8: nothing, no exception
    assert _guards_in(str(path), on_hopper) == []


def _backward_guard(flags: dict[str, bool]) -> FlaGuard | None:
    return next((g for g in fla_guards(flags) if g.function == "chunk_bwd_dqkwg"), None)


@needs_fla
def test_the_gated_backward_guard_is_read_from_the_installed_fla():
    """fla-core 0.6.0 refuses the gated chunk_bwd_dqkwg on Hopper with triton >= 3.4.0 and < 3.7.1: the
    guard is found in its source, and holds exactly where its flags say so."""
    guard = _backward_guard(HOPPER_WITH_TRITON_3_6)
    assert guard is not None and guard.applies
    assert guard.flags == HOPPER_WITH_TRITON_3_6 and guard.other_terms == ["g is not None"]
    assert "Triton >= 3.4.0 and < 3.7.1 on Hopper GPUs" in guard.message
    for flag, value in HOPPER_WITH_TRITON_3_6.items():  # any one flag the other way: no refusal
        assert not _backward_guard(HOPPER_WITH_TRITON_3_6 | {flag: not value}).applies


REFUSE = """
import json, sys, torch
import fla.ops.common.chunk_o as chunk_o
from dflashdoctor.fla_guards import FlaGuard, fla_guards, refusing_guard

flags = json.loads(sys.argv[1])
for name, value in flags.items():  # this CPU made to look like an H200 with triton 3.6, to FLA only
    setattr(chunk_o, name, value)
try:
    chunk_o.chunk_bwd_dqkwg(None, None, None, None, None, None, g=torch.zeros(1))
except RuntimeError as exc:
    guard = refusing_guard(exc, fla_guards(flags))
    print(json.dumps(guard.to_dict() if guard else None))
"""


@needs_fla
def test_a_refusal_raised_by_fla_is_matched_to_its_guard():
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(REFUSE), json.dumps(HOPPER_WITH_TRITON_3_6)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    guard = json.loads(done.stdout.strip().splitlines()[-1])
    assert guard["function"] == "chunk_bwd_dqkwg" and guard["applies"]


@needs_fla
@pytest.mark.skipif(torch.cuda.is_available(), reason="a machine without a GPU")
def test_env_on_a_cpu_with_fla_says_its_kernels_cannot_run_here(cli_here):
    run = cli_here("env")
    assert run.code == 0, run.stdout + run.stderr
    (unavailable,) = run.findings("kernel-unavailable")
    assert unavailable["severity"] == "warning" and "is installed but its kernels cannot run" in unavailable["title"]
    assert run.check("fla kernels")["status"] == "warn"


@needs_fla
@pytest.mark.gpu
def test_env_on_a_gpu_reports_the_guards_that_hold_here_without_running_a_model(cli_here):
    """On a GPU node env judges FLA from its flags alone: each guard that holds here is a finding,
    the same ones a model trace would meet."""
    platform, flags = fla_flags()
    holding = sorted(g.function for g in fla_guards(flags) if g.applies)
    run = cli_here("env")
    assert run.code == 0, run.stdout + run.stderr
    assert platform == "cuda"
    found = run.findings("kernel-unavailable")
    assert sorted(f["evidence"]["guard"]["function"] for f in found) == holding
    assert run.check("fla kernels")["status"] == ("warn" if holding else "pass")
