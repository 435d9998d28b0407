"""The embedded reference DFlash setup: a small but real pipeline every command can run on.

`masks` builds the attention masks, `drafter` holds the drafter attention and its compiled
flex_attention entry, and `faults` holds entries that plant each known fault on purpose, so that
every probe can be shown catching it and shown silent on the healthy entry.
"""

DEFAULT_TARGET = "dflashdoctor.reference.drafter:flex_attention_forward"

# Fault switches of the reference drafter step (reference/drafter_step.py says what each plants).
DRAFTER_FAULTS = ("hf-flex-path", "eager-wrapper")
