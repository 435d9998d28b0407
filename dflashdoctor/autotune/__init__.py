"""The shared-autotuner race: what the installed triton keeps on the instance, and a workload that
shows whether threads sharing one autotuner break it (probed side: standard library, torch, triton)."""

FIXES = ("none", "lock", "sequential")  # no fix, a per-instance lock on Autotuner.run, serialized callers
KERNELS = ("stub",)  # the workloads the race probe can run here
