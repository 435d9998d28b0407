"""Entries that plant one known fault each, with the healthy entry's call convention.

Each module exposes `flex_attention_forward(query, key, value, block_mask=None, enable_gqa=False,
scale=None)`, so any of them can stand in for `dflashdoctor.reference.drafter:flex_attention_forward`:

- `raw_call`: calls flex_attention without torch.compile (dense forward and backward).
- `rebound`: compiles flex_attention, then rebinds the compiled name to the raw function.
- `global_length`: a score_mod reads a module-level int that changes with the batch's length, so
  every new length recompiles until dynamo gives up and runs dense.
- `retried_call`: the first attempt raises inside the compiled frame and is retried, which makes
  dynamo skip flex_attention's frame for the rest of the process (dense from then on).
"""
