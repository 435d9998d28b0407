"""dflashdoctor: diagnoses compiled-attention training pipelines.

This package is imported on both sides: by the CLI (the doctor side) and inside the probed
process, which may be another interpreter. So importing it must stay cheap and pull in nothing
beyond the standard library; torch, typer and rich are imported only by the modules that need them.
"""

__version__ = "0.1.0"
