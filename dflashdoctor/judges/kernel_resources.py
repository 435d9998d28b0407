"""A Triton kernel that does not fit the GPU: its own cause, not "the target raised".

Triton refuses to launch a kernel that needs more of a per-block resource than the GPU has
(`triton.runtime.errors.OutOfResources`: shared memory, tensor memory, registers), and Inductor
passes the refusal on inside its own errors (`No valid triton configs. OutOfResources: ...`).
Inductor's own launcher checks shared memory before Triton does and words it differently, naming
the kernel instead of the resource (`OutOfMemoryError: out of resource: triton_tem_fused_flex_attention_4
Required: 721408 Hardware limit:232448`, seen on an H200 with torch 2.11). The words stay the same
however many wrappers the exception passes through, so the message and traceback are read, not
the exception type. flex_attention's
compiled backward is the common victim: its default tiles at head_dim 128 need more shared memory
than GPUs with about 100 KB per block (RTX 4090/5090, RTX PRO 6000 Blackwell) have, while the
H100/H200 have 227 KB.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from dflashdoctor.codes import finding
from dflashdoctor.report import Finding, Where

_OUT_OF_RESOURCE = re.compile(
    r"out of resource: (?P<resource>[\w ]{1,40}?), "
    r"Required: (?P<required>\d{1,18}), Hardware limit: (?P<limit>\d{1,18})\b"
)
# torch's static CUDA launcher: the kernel's name where Triton puts the resource, always shared memory
_LAUNCHER_REFUSAL = re.compile(
    r"out of resource: (?P<kernel>\w{1,200}) Required: (?P<required>\d{1,18}) Hardware limit:\s?(?P<limit>\d{1,18})\b"
)
_KERNEL = re.compile(r"\b(triton_(?:tem|per|red|poi|for)_\w+|triton_\w*flex\w*)")
_FLEX_BACKWARD = ("flex_attention_backward", "flex_backward", "sdpa_backward", ".backward(")


@dataclass(frozen=True)
class OutOfResources:
    resource: str
    required: int
    limit: int
    kernel: str | None
    backward: bool

    @staticmethod
    def read(message: str, traceback: str = "") -> OutOfResources | None:
        """The refusal in an error's message or traceback, or None when the error is another."""
        text = f"{message}\n{traceback}"
        match = _OUT_OF_RESOURCE.search(text)
        launcher = None if match else _LAUNCHER_REFUSAL.search(text)
        if launcher is not None:
            resource, kernel = "shared memory", launcher.group("kernel")
            match = launcher
        elif match is not None:
            found = _KERNEL.search(text)
            resource, kernel = match.group("resource"), found.group(1) if found else None
        else:
            return None
        return OutOfResources(
            resource=resource,
            required=int(match.group("required")),
            limit=int(match.group("limit")),
            kernel=kernel,
            backward=any(marker in text for marker in _FLEX_BACKWARD) or "backward" in (kernel or ""),
        )

    def fix(self) -> str:
        prefix = "bwd_" if self.backward else "fwd_"
        tiles = (
            "`kernel_options={'bwd_BLOCK_M1': 32, 'bwd_BLOCK_N1': 64, 'bwd_BLOCK_M2': 64, 'bwd_BLOCK_N2': 32, "
            "'bwd_num_stages': 1}`"
            if self.backward
            else "`kernel_options={'fwd_BLOCK_M': 64, 'fwd_BLOCK_N': 64, 'fwd_num_stages': 1}`"
        )
        return (
            f"Ask flex_attention for smaller tiles or fewer pipeline stages on this GPU, e.g. {tiles} (halve "
            f"the `{prefix}` block sizes until it fits), or use a smaller head_dim. The {self.resource} a "
            "kernel needs grows with its block sizes, num_stages and head_dim; GPUs differ in how much they "
            "have per block (H100/H200 227 KB of shared memory, RTX 4090/5090 and RTX PRO 6000 about 100 KB)."
        )


def out_of_resources_finding(found: OutOfResources, during: str, where: Where | None) -> Finding:
    kernel = f"`{found.kernel}`" if found.kernel else "a Triton kernel"
    direction = "the compiled backward's " if found.backward else ""
    return finding(
        "kernel-out-of-resources",
        f"{direction}{kernel} needs {found.required:,} of {found.resource}; this GPU allows {found.limit:,}",
        detail=(
            f"During {during}, Triton refused to launch {kernel}: it needs {found.required:,} of "
            f"{found.resource} per block and the GPU's hardware limit is {found.limit:,}. This is the kernel's "
            "configuration against this GPU, not a bug in the model: the same code can run on a GPU with more."
        ),
        where=where,
        evidence={
            "resource": found.resource,
            "required": found.required,
            "limit": found.limit,
            "kernel": found.kernel,
            "backward": found.backward,
        },
        fix=found.fix(),
    )
