"""A traceback's frames split by whose code they are: the user's, a library's (transformers,
accelerate, FLA, a training framework), torch's and triton's own. The user's innermost frame is the
call site a fix goes to; the first library the path passes through on the way in says whether the
flex_attention call came through the user's wrapper or a library's own path."""

from __future__ import annotations

import re
from dataclasses import dataclass

from dflashdoctor.cache.layout import written_by_a_cache
from dflashdoctor.explain.reader import Frame, Traceback

# packages a frame's path names as a folder: whose code it is
_INTERNALS = ("torch", "triton", "functorch", "torchgen")
_TOOLS = ("dflashdoctor",)  # the doctor's own instruments, on the stack of a run it watched
_LIBRARIES = (
    "transformers", "accelerate", "fla", "mamba_ssm", "peft", "trl", "deepspeed", "lightning",
    "pytorch_lightning", "lightning_fabric", "flash_attn", "xformers", "vllm", "sglang", "specforge",
    "torchtitan", "torchtune", "olmo_core", "lm_eval", "datasets", "tokenizers", "unsloth", "unsloth_zoo",
    "megatron", "apex", "composer", "dion", "numpy", "hydra", "omegaconf",
)  # fmt: skip
_ENVIRONMENT = re.compile(r"site-packages|dist-packages|/lib/python3\.\d+/(?!site-packages)")


def owner(frame: Frame) -> str:
    """`user`, `torch` (torch, triton and their internals), `tool` (dflashdoctor's instruments), or
    the library's package name."""
    path = frame.path.replace("\\", "/")
    if path.startswith("<") or written_by_a_cache(path):  # code torch generated, in its cache or not on disk
        return "torch"
    folders = path.split("/")[:-1]
    installed = bool(_ENVIRONMENT.search(path))
    for i, folder in enumerate(folders):
        # a package's folder: installed, a checkout's `src/NAME`, or with its own subfolders below
        # (`lightning/repro.py` in a checkout named lightning is the user's script)
        package = installed or (i > 0 and folders[i - 1] == "src") or i < len(folders) - 1
        if package and folder in _INTERNALS:
            return "torch"
        if package and folder in _TOOLS:
            return "tool"
        if package and folder in _LIBRARIES:
            return folder
    return "library" if installed else "user"


@dataclass
class CallPath:
    user_frame: Frame | None
    library: str  # the first library on the path inward from the user's frame, "" for none
    owners: list[tuple[str, Frame]]  # each frame with its owner, outermost first


def call_path(traceback: Traceback | None) -> CallPath:
    if traceback is None:
        return CallPath(None, "", [])
    owners = [(owner(frame), frame) for frame in traceback.frames]
    users = [i for i, (who, _) in enumerate(owners) if who == "user"]
    user_frame = owners[users[-1]][1] if users else None
    inward = owners[users[-1] + 1 :] if users else owners
    library = next((who for who, _ in inward if who not in ("user", "torch", "tool", "library")), "")
    return CallPath(user_frame, library, owners)
