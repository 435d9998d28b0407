"""On two GPUs: the two-node run of test_run.py with NCCL, one GPU per "node" (CUDA_VISIBLE_DEVICES),
one worker each, rank 1 calling flex_attention raw on its GPU. The merged report is kept in the
evidence folder (reports/examples/h200x2-run-two-nodes/ once run on two H200s)."""

from __future__ import annotations

import json
import shutil

import pytest

from tests.integration.sshd import free_port
from tests.integration.test_run import _two_node_run

pytestmark = pytest.mark.gpu


def test_two_nodes_with_nccl_merge_by_rank(tmp_path, evidence):
    import torch

    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs: one per node")
    shared = tmp_path / "shared"
    port = free_port()
    nodes = [
        _two_node_run(
            shared,
            rank,
            port,
            "--merge-wait",
            "300",
            per_node=1,
            env={"DDP_BACKEND": "nccl", "CUDA_VISIBLE_DEVICES": str(rank), "FAULT_RANK": "1"},
        )
        for rank in (0, 1)
    ]
    outputs = [node.communicate(timeout=600) for node in nodes]
    shutil.copytree(shared, evidence / "shared", dirs_exist_ok=True)
    assert [node.returncode for node in nodes] == [1, 1], outputs
    merged = json.loads((shared / "report.json").read_text())
    (ranks,) = [t for t in merged["results"][0]["tables"] if t["title"] == "ranks"]
    assert sorted((row[0], row[2]) for row in ranks["rows"]) == [("0", "0"), ("1", "1")]
    dense = [
        (r["probe"], f["evidence"]["rank"])
        for r in merged["results"]
        for f in r["findings"]
        if f["code"] == "dense-forward"
    ]
    assert dense == [("node 1: rank 1 (local rank 0)", 1)]
    (finding,) = [f for r in merged["results"] for f in r["findings"] if f["code"] == "dense-forward"]
    assert "cuda" in json.dumps(finding["evidence"])
