"""The judge of a run across nodes, in this process, on the parts a real two-node torchrun wrote
(tests/integration/test_run.py's, kept in cpu/run-two-nodes/: four gloo ranks on two nodes, rank 3
calling flex_attention raw): per node, per rank, and a part that never came."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from dflashdoctor.commands.merge import merge
from dflashdoctor.runs.parts import find_parts, node_part
from tests.unit.recorded import ASSETS

CASES = {
    "node-missing": "cpu/run-two-nodes with node1's report taken away, and with node1 absent",
    "node-parts-mixed": "cpu/run-two-nodes with node1's node.json claiming node 0, 3 nodes, or another command",
    "node-part-damaged": "cpu/run-two-nodes with rank 3's WORLD_SIZE out of range, node1's events a link, or "
    "node1's folder another user's",
}
PARTS = ASSETS / "cpu" / "run-two-nodes"


def _copy(tmp_path: Path) -> Path:
    shared = tmp_path / "shared"
    shutil.copytree(PARTS, shared)
    (shared / "merged.report.json").unlink()
    return shared


def test_the_parts_merge_again_as_their_run_merged_them(tmp_path):
    merged = merge(_copy(tmp_path), ["dflashdoctor", "merge"])
    recorded = json.loads((PARTS / "merged.report.json").read_text(encoding="utf-8"))
    assert [r.probe for r in merged.results] == [r["probe"] for r in recorded["results"]]
    assert [r.status for r in merged.results] == [r["status"] for r in recorded["results"]]
    dense = [(r.probe, f.evidence["rank"]) for r in merged.results for f in r.findings if f.code == "dense-forward"]
    assert dense == [("node 1: rank 3 (local rank 1)", 3)]
    (ranks,) = merged.results[0].tables
    assert sorted(row[2] for row in ranks.rows) == ["0", "1", "2", "3"]
    assert merged.verdict == "fail" and merged.exit_code() == 1


def test_a_node_that_never_finished_is_named(tmp_path):
    shared = _copy(tmp_path)
    (shared / "node1-vm" / "report.json").unlink()  # started (node.json), never reported
    merged = merge(shared, ["dflashdoctor", "merge"])
    (missing,) = [f for f in merged.results[0].findings if f.code == "node-missing"]
    assert missing.evidence == {"expected": 2, "unfinished": ["node1-vm"], "absent": 0}
    assert {c.name: c.status for c in merged.results[0].checks}["node1-vm"] == "fail"
    assert not [f for r in merged.results for f in r.findings if f.code == "dense-forward"]  # rank 3 was there


def test_a_part_whose_observations_cannot_be_read_is_named_so(tmp_path):
    shared = _copy(tmp_path)
    (shared / "node1-vm" / "observations.json").write_bytes(b"\xff{ not json")
    merged = merge(shared, ["dflashdoctor", "merge"])
    checks = {c.name: c for c in merged.results[0].checks}
    assert checks["node1-vm"].status == "fail"
    assert checks["node1-vm"].summary.endswith("wrote a report, but its observations.json cannot be read")


def test_a_report_folder_is_whole_once_its_report_json_is_there(tmp_path, monkeypatch):
    """Node 0 polls for each part's report.json and then reads its observations.json: the report
    must come last, or node 0 merges a part it sees as done without what its node observed (seen in
    CI: two nodes merged, node 1's ranks missing)."""
    from dflashdoctor import render, report_folder

    written: list[str] = []
    real_replace = report_folder.os.replace

    def recording_replace(source, target, **folders):
        written.append(Path(target).name)
        real_replace(source, target, **folders)

    monkeypatch.setattr(report_folder.os, "replace", recording_replace)
    merged = merge(_copy(tmp_path), ["dflashdoctor", "merge"])
    render.write_report_dir(merged, tmp_path / "out", merged.observations_json())
    assert written[0] == "observations.json" and written[-1] == "report.json"
    assert sorted(written) == sorted(["observations.json", *render.FILES])


def test_a_node_that_never_started_is_counted(tmp_path):
    shared = _copy(tmp_path)
    shutil.rmtree(shared / "node1-vm")
    merged = merge(shared, ["dflashdoctor", "merge"])
    (missing,) = [f for f in merged.results[0].findings if f.code == "node-missing"]
    assert missing.evidence["absent"] == 1 and missing.title == "1 of 2 nodes' parts of the run are missing"
    assert [p.name for p in find_parts(shared)] == ["node0-vm"]


def test_which_node_a_launch_is():
    torchrun = ["torchrun", "--nnodes", "2", "--node-rank", "1", "train.py"]
    part = node_part(torchrun, {})
    assert (part.nnodes, part.node_rank) == (2, 1) and part.folder.startswith("node1-")
    assert node_part(["python", "-m", "torch.distributed.run", "--nnodes=1:4", "--node_rank=3", "t.py"], {}).nnodes == 4
    assert node_part(["torchrun", "--standalone", "--nproc-per-node", "2", "t.py"], {}) is None
    assert node_part(["python", "train.py"], {"SLURM_NNODES": "4", "SLURM_NODEID": "2"}).node_rank == 2
    assert node_part(["python", "train.py"], {"SLURM_NNODES": "1"}) is None
    assert node_part(["python", "train.py", "--nnodes", "8"], {}) is None  # not a launcher's flag
    hostile = node_part(["torchrun", "--nnodes", "2", "t.py"], {})
    assert "/" not in hostile.folder and hostile.node_rank is None


def test_a_hostile_node_json_is_read_for_what_it_can_be(tmp_path):
    """The shared folder is every node's: node.json of another shape, a link, or not JSON at all is
    never trusted into a crash."""
    shared = _copy(tmp_path)
    (shared / "odd").mkdir()
    (shared / "odd" / "node.json").write_text(json.dumps({"nnodes": "2; rm -rf /", "node_rank": [1], "host": {}}))
    (shared / "garbage").mkdir()
    (shared / "garbage" / "node.json").write_bytes(b"\xff\xfe not json")
    (shared / "linked").symlink_to(shared / "node0-vm", target_is_directory=True)
    parts = find_parts(shared)
    assert [p.name for p in parts] == ["node0-vm", "node1-vm", "linked", "odd"]
    assert parts[3].record["nnodes"] is None and parts[3].record["node_rank"] is None
    assert parts[2].refused == "its folder is a symbolic link (never followed)"
    merged = merge(shared, ["dflashdoctor", "merge"])
    (missing,) = [f for f in merged.results[0].findings if f.code == "node-missing"]
    assert missing.evidence["unfinished"] == ["odd"]
    (damaged,) = [f for f in merged.results[0].findings if f.code == "node-part-damaged"]
    assert damaged.evidence["parts"] == [{"part": "linked", "why": "its folder is a symbolic link (never followed)"}]


def _set_world_size(shared: Path, value: str) -> None:
    """Rank 3's start record (node1-vm) saying WORLD_SIZE=value, as a hostile or broken part would."""
    events = shared / "node1-vm" / "events" / "vm-13219.jsonl"
    lines = events.read_text().splitlines()
    start = json.loads(lines[0])
    start["env"]["WORLD_SIZE"] = value
    events.write_text("\n".join([json.dumps(start), *lines[1:]]) + "\n")


@pytest.mark.parametrize(
    "value",
    ["3000000000", "\u00b2", "9" * 5000, "-1", " 4", "\u0664"],
    ids=["three-billion", "superscript-two", "5000-digits", "negative", "space", "arabic-indic-four"],
)
def test_a_part_whose_world_size_no_run_has_is_damaged_and_sizes_nothing(tmp_path, value):
    """WORLD_SIZE "3000000000" took the merge to 23 GB (a set of every rank); "²" and 5,000 digits
    exited 3 (int() refuses them). The part is named damaged, and nothing of it is judged."""
    shared = _copy(tmp_path)
    _set_world_size(shared, value)
    merged = merge(shared, ["dflashdoctor", "merge"])
    (damaged,) = [f for f in merged.results[0].findings if f.code == "node-part-damaged"]
    assert damaged.evidence["parts"][0]["part"] == "node1-vm"
    assert "WORLD_SIZE=" in damaged.evidence["parts"][0]["why"]
    assert merged.exit_code() == 1
    assert not [r for r in merged.results if r.probe.startswith("node 1")]  # nothing of the damaged part


def test_a_world_size_in_range_lists_at_most_a_few_missing_ranks(tmp_path):
    shared = _copy(tmp_path)
    for events in (shared / "node0-vm" / "events", shared / "node1-vm" / "events"):
        for path in events.glob("*.jsonl"):
            lines = path.read_text().splitlines()
            start = json.loads(lines[0])
            if "WORLD_SIZE" in start["env"]:
                start["env"]["WORLD_SIZE"] = "1000000"
            path.write_text("\n".join([json.dumps(start), *lines[1:]]) + "\n")
    merged = merge(shared, ["dflashdoctor", "merge"])
    ranks = {c.name: c for c in merged.results[0].checks}["ranks"]
    assert ranks.status == "warn" and ranks.summary.startswith("4 of world size 1000000; missing [4, 5,")
    assert ranks.summary.endswith("...")


def test_a_parts_events_reached_through_a_link_are_never_read(tmp_path):
    """A part in the shared folder whose `events` is a link to another run's (root's private one):
    that run's exception text would have gone into the merged report."""
    shared = _copy(tmp_path)
    private = tmp_path / "private-run"
    shutil.copytree(shared / "node1-vm" / "events", private)
    (private / "vm-13219.jsonl").write_text(
        (private / "vm-13219.jsonl").read_text().replace('"kind": "progress"', '"kind": "progress", "x": "PRIVATE"', 1)
    )
    shutil.rmtree(shared / "node1-vm" / "events")
    (shared / "node1-vm" / "events").symlink_to(private, target_is_directory=True)
    merged = merge(shared, ["dflashdoctor", "merge"])
    (damaged,) = [f for f in merged.results[0].findings if f.code == "node-part-damaged"]
    assert damaged.evidence["parts"] == [
        {"part": "node1-vm", "why": "its events folder is a symbolic link (never followed)"}
    ]
    assert "PRIVATE" not in merged.to_json()


@pytest.mark.parametrize(
    ("change", "said"),
    [
        ({"node_rank": 0}, "node rank 0 has 2 parts"),
        ({"nnodes": 3}, "the parts say 2 or 3 nodes"),
        ({"command": ["python3", "other_run.py"]}, "the parts ran 2 different commands"),
    ],
)
def test_parts_that_are_not_one_run_are_an_error(tmp_path, change, said):
    """A shared folder reused by another run, or a node started twice: merged as they are, one run's
    ranks would be judged with another's; before, such a merge could pass."""
    shared = _copy(tmp_path)
    record = json.loads((shared / "node1-vm" / "node.json").read_text())
    (shared / "node1-vm" / "node.json").write_text(json.dumps(record | change))
    merged = merge(shared, ["dflashdoctor", "merge"])
    (mixed,) = [f for r in merged.results for f in r.findings if f.code == "node-parts-mixed"]
    assert mixed.severity == "error" and said in mixed.title


def test_the_parts_of_one_run_are_not_mixed(tmp_path):
    merged = merge(_copy(tmp_path), ["dflashdoctor", "merge"])
    assert not [f for r in merged.results for f in r.findings if f.code == "node-parts-mixed"]


def test_many_unfinished_parts_make_a_finding_of_bounded_size(tmp_path):
    """3,001 parts that never finished made a 367 MB junit.xml: the node-missing finding, shown at
    every part's check, named every part. Its words name a few, its evidence at most 64."""
    shared = _copy(tmp_path)
    record = json.loads((shared / "node1-vm" / "node.json").read_text())
    for rank in range(2, 302):
        (shared / f"node{rank}-vm").mkdir()
        (shared / f"node{rank}-vm" / "node.json").write_text(json.dumps(record | {"node_rank": rank, "nnodes": 302}))
    merged = merge(shared, ["dflashdoctor", "merge"])
    (missing,) = [f for f in merged.results[0].findings if f.code == "node-missing"]
    assert len(missing.detail) < 2000 and len(missing.evidence["unfinished"]) == 64
    assert "and 292 more" in missing.detail
