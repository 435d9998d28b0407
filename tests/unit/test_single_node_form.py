"""The gate runs the team's command on each node alone: torchrun's options that join nodes are dropped
and `--standalone` added, the script and its own arguments never touched. The end-to-end proof (a
`--nnodes 3` command that would otherwise wait in its rendezvous) is tests/integration/test_nodes_run.py."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dflashdoctor.gate.run_smoke import single_node_form

JOINING = [
    "--nnodes",
    "--node-rank",
    "--node_rank",
    "--rdzv-endpoint",
    "--rdzv_backend",
    "--master-addr",
    "--master_port",
]


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        (
            "torchrun --nnodes 2 --node-rank 1 --nproc-per-node 8 --master-addr=n0 train.py --nnodes 3",
            "torchrun --standalone --nproc-per-node 8 train.py --nnodes 3",
        ),
        (
            "python -m torch.distributed.run --rdzv_endpoint n0:29500 --rdzv_backend c10d --nproc_per_node=4 t.py",
            "python -m torch.distributed.run --standalone --nproc_per_node=4 t.py",
        ),
        ("torchrun --standalone --nproc-per-node 2 t.py", "torchrun --standalone --nproc-per-node 2 t.py"),
        ("/opt/venv/bin/torchrun -m pkg.train --lr 1", "/opt/venv/bin/torchrun --standalone -m pkg.train --lr 1"),
        ("python train.py --nnodes 2", "python train.py --nnodes 2"),  # not torchrun: the user's own form
        ("accelerate launch --num_machines 2 t.py", "accelerate launch --num_machines 2 t.py"),
        ("torchrun --nnodes 2 -- t.py --nnodes 2", "torchrun --standalone -- t.py --nnodes 2"),
        ("torchrun --nnodes 2", "torchrun --standalone"),
        (
            "python -m torch.distributed.launch --use_env --nnodes 2 --nproc_per_node 2 t.py",
            "python -m torch.distributed.launch --standalone --use_env --nproc_per_node 2 t.py",
        ),  # no script: torchrun says so itself
    ],
)
def test_the_single_node_form(command, expected):
    assert " ".join(single_node_form(command.split())) == expected


_values = st.text("abcdefgh0123456789:.=-", min_size=1, max_size=8).filter(lambda v: not v.startswith("-"))
_joining = st.tuples(st.sampled_from(JOINING), _values).map(list)
_kept = st.tuples(st.sampled_from(["--nproc-per-node", "--max-restarts", "--tee"]), _values).map(list)
_options = st.lists(st.one_of(_joining, _kept), max_size=6).map(lambda pairs: [w for pair in pairs for w in pair])
_script_args = st.lists(st.sampled_from(["--nnodes", "2", "--standalone", "-m", "x", "--master-addr=h"]), max_size=6)


@given(_options, _script_args)
def test_joining_options_go_and_everything_else_stays(options, script_args):
    command = ["torchrun", *options, "train.py", *script_args]
    single = single_node_form(command)
    script = single.index("train.py")
    launcher = single[1:script]
    assert launcher[0] == "--standalone" and not set(launcher) & set(JOINING)
    kept = [w for i, w in enumerate(options) if options[i - (i % 2)] not in JOINING]
    assert launcher[1:] == kept
    assert single[script:] == ["train.py", *script_args]
    assert single_node_form(single) == single  # already single-node: unchanged
