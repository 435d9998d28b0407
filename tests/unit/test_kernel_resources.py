"""A Triton kernel that does not fit the GPU is its own finding, read from Triton's real exception as
Inductor passes it on, in check-compile, trace-attention and run alike."""

from __future__ import annotations

import pytest

from dflashdoctor.judges.kernel_resources import OutOfResources
from tests.unit.recorded import codes, documented, judged, raw

triton_errors = pytest.importorskip("triton.runtime.errors")
CASES = {"kernel-out-of-resources": "cpu/check-compile-raises with Triton's refusal as its error"}

# The shape of the public complaint: the compiled flex backward at head_dim 128 on a ~100 KB GPU.
REFUSED = triton_errors.OutOfResources(131074, 101376, "shared memory")
KERNEL = "triton_tem_fused_flex_attention_backward_zeros_1"
TRACEBACK = (
    "Traceback (most recent call last):\n"
    '  File "train.py", line 40, in step\n    loss.backward()\n'
    f'  File "/tmp/torchinductor_root/ab/cab.py", line 900, in call\n    {KERNEL}.run(buf0, grid=grid)\n'
)


def _error(message: str) -> dict:
    return {"type": "RuntimeError", "message": message, "traceback": TRACEBACK + f"RuntimeError: {message}\n"}


@pytest.mark.parametrize(
    "message",
    [str(REFUSED), f"No valid triton configs. OutOfResources: {REFUSED}", f"NoTritonConfigsError: ({REFUSED})"],
)
def test_triton_refusal_is_read_however_inductor_wraps_it(message):
    read = OutOfResources.read(message, TRACEBACK)
    assert read == OutOfResources("shared memory", 131074, 101376, KERNEL, backward=True)
    assert "bwd_BLOCK_M1" in read.fix() and "num_stages" in read.fix()


def test_inductors_launcher_refusal_names_the_kernel_in_the_resources_place():
    # word for word what torch 2.11 raised on an H200 (tests/targets/oversized_tiles.py)
    message = (
        "No valid triton configs. OutOfMemoryError: out of resource: triton_tem_fused_flex_attention_4 "
        "Required: 721408 Hardware limit:232448 Reducing block sizes or `num_stages` may help."
    )
    read = OutOfResources.read(message, "")
    assert read == OutOfResources("shared memory", 721408, 232448, "triton_tem_fused_flex_attention_4", False)
    assert "fwd_BLOCK_M" in read.fix()
    backward = message.replace("flex_attention_4", "flex_attention_backward_7")
    assert OutOfResources.read(backward, "").backward


def test_other_errors_are_not_read_as_resources():
    assert OutOfResources.read("CUDA out of memory. Tried to allocate 2.00 GiB", TRACEBACK) is None
    assert OutOfResources.read("Required: 5, Hardware limit: 3", "") is None
    # a crafted 5000-digit number is no refusal (and no int() past Python's digit limit)
    assert OutOfResources.read(f"out of resource: shared memory, Required: {'9' * 5000}, Hardware limit: 5", "") is None


def test_check_compile_says_the_kernel_does_not_fit_instead_of_target_raised():
    error = {**raw("cpu/check-compile-raises")["target_error"], **_error(f"No valid triton configs. {REFUSED}")}
    (result,) = judged("cpu/check-compile-raises", target_error=error)
    assert "target-raised" not in codes([result])
    (refused,) = documented([result], "kernel-out-of-resources")
    assert refused.evidence == {
        "resource": "shared memory",
        "required": 131074,
        "limit": 101376,
        "kernel": KERNEL,
        "backward": True,
    }
    assert KERNEL in refused.title and "101,376" in refused.title and result.status == "fail"


def test_trace_attention_script_that_hits_it_gets_the_same_finding():
    script = raw("cpu/trace-script-raises")["traced_script"]
    (result,) = judged("cpu/trace-script-raises", traced_script={**script, "error": _error(str(REFUSED))})
    assert "target-raised" not in codes([result]) and documented([result], "kernel-out-of-resources")


def test_the_h200_refusal_in_the_compiled_backward_is_judged_as_such():
    """Recorded on an H200 (reports/examples/h200-realworld-oversized-tiles): the forward fused,
    then Inductor's launcher refused the compiled backward. The backward and memory checks say
    they were not reached, not "fused"."""
    (result,) = judged("h200/check-compile-oversized-tiles")
    (refused,) = documented([result], "kernel-out-of-resources")
    assert refused.evidence["kernel"] == "triton_tem_fused_flex_attention_backward_1"
    assert (refused.evidence["required"], refused.evidence["limit"]) == (344064, 232448)
    assert refused.evidence["backward"] and "bwd_BLOCK_M1" in refused.fix
    checks = {c.name: c for c in result.checks}
    assert checks["forward"].status == "pass"
    assert checks["backward"].status == "skip" and "it raised" in checks["backward"].summary
    assert checks["memory"].status == "skip" and "target:first:backward" in checks["memory"].summary
