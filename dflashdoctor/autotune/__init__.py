"""The shared-autotuner race: what the installed triton keeps on the instance, and a workload that
shows whether threads sharing one autotuner break it (probed side: standard library, torch, triton)."""

FIXES = ("none", "lock", "sequential")  # no fix, a per-instance lock on Autotuner.run, serialized callers
KERNELS = ("stub", "fla", "reference")  # built-in workloads; a TARGET `module:attr` or `file.py:attr` is the third kind
FLA_TARGET = "dflashdoctor.autotune.fla_workload:gated_delta_rule_forward"
