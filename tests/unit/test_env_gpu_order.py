"""env names each GPU by its CUDA index. nvidia-smi lists GPUs in PCI bus order, CUDA fastest first
(unless CUDA_DEVICE_ORDER=PCI_BUS_ID), so nvidia-smi's list is used only where the two orders agree
or cannot differ; elsewhere env asks torch. The rule on real rows of mixed and matched machines."""

from __future__ import annotations

from probes.env import gpus_in_cuda_order

H200 = {"name": "NVIDIA H200", "capability": "9.0", "memory_bytes": 150_754_820_096}
L4 = {"name": "NVIDIA L4", "capability": "8.9", "memory_bytes": 24_152_899_584}


def _listed(*gpus: dict) -> list[dict]:
    return [{"index": i, **g} for i, g in enumerate(gpus)]


def test_alike_gpus_are_named_from_nvidia_smi_in_either_order():
    listed = _listed(H200, H200)
    assert gpus_in_cuda_order(listed, 2, {}) == listed


def test_mixed_gpus_ask_torch_unless_cuda_counts_in_pci_order():
    listed = _listed(L4, H200)  # PCI order; CUDA's default puts the faster H200 first
    assert gpus_in_cuda_order(listed, 2, {}) is None
    assert gpus_in_cuda_order(listed, 2, {"CUDA_DEVICE_ORDER": "FASTEST_FIRST"}) is None
    assert gpus_in_cuda_order(listed, 2, {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}) == listed


def test_renumbered_or_miscounted_gpus_ask_torch():
    listed = _listed(H200, H200)
    assert gpus_in_cuda_order(listed, 2, {"CUDA_VISIBLE_DEVICES": "1,0"}) is None
    assert gpus_in_cuda_order(listed, 1, {}) is None
    assert gpus_in_cuda_order(None, 2, {}) is None
