"""Where the tests' own files are, wherever a test module sits."""

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent  # the repository
TARGETS = ROOT / "tests" / "targets"  # user code the commands are pointed at
DRAFTER_STEP = ROOT / "dflashdoctor" / "reference" / "drafter_step.py"  # where the eager-wrapper fault compiles


def eager_wrapper_compiled_at() -> str:
    """`file:line` of the reference drafter's eager-backend wrapper compile: the line a dense finding's
    cause and fix must name (found in the source, so moving the line does not break the GPU tests)."""
    source = DRAFTER_STEP.read_text(encoding="utf-8").splitlines()
    line = next(n for n, text in enumerate(source, 1) if 'torch.compile(flex_attention, backend="eager")' in text)
    return f"{DRAFTER_STEP}:{line}"


def eager_wrapper_cause(compiled_at: str) -> str:
    """The cause a dense call through that wrapper must be given."""
    return f"the flex_attention wrapper is compiled with backend='eager' at {compiled_at}, which never reaches Inductor"
