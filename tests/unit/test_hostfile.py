"""The hostfile parser: DeepSpeed's and MPI's `host slots=N` lines, comments, the python= word, and
any other text refused with its line, never a traceback (Hypothesis)."""

from __future__ import annotations

import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dflashdoctor.errors import BadInput
from dflashdoctor.gate.hostfile import MAX_NODES, Node, nodes_of, parse_hostfile, read_hostfile


def test_deepspeed_and_mpi_lines():
    text = "# cluster\nworker-1 slots=8\n\n  worker-2 slots=8 max_slots=16  # spare\nroot@10.0.0.3:2222\n"
    assert parse_hostfile(text, "hf") == [
        Node("worker-1", 8),
        Node("worker-2", 8),
        Node("root@10.0.0.3:2222"),
    ]


def test_python_word_gives_a_node_its_interpreter():
    (node,) = parse_hostfile("gpu-7 slots=4 python=/opt/venv/bin/python3\n", "hf")
    assert node == Node("gpu-7", 4, "/opt/venv/bin/python3")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("# only a comment\n", "hf names no node"),
        ("a slots=x\n", "hf:1: slots must be a whole number from 1 to 4096, not 'x'"),
        ("a slots=9999\n", "hf:1: slots must be a whole number from 1 to 4096, not 9999"),
        ("a slots=1 slots=2\n", "hf:1: slots is given twice"),
        ("a python=\n", "hf:1: 'python=' is not slots=N, max_slots=N or python=PATH"),
        ("a\nb\na\n", "hf:3: a is listed already, at line 1"),
        ("a;rm -rf /\n", "hf:1: 'a;rm': expected [user@]host[:port]"),
        ("host:70000\n", "hf:1: 'host:70000': port 70000 is out of range"),
    ],
)
def test_bad_lines_name_their_line(text, message):
    with pytest.raises(BadInput) as raised:
        parse_hostfile(text, "hf")
    assert str(raised.value) == message


def test_too_many_nodes():
    with pytest.raises(BadInput, match=f"more than {MAX_NODES} nodes"):
        parse_hostfile("".join(f"n{i}\n" for i in range(MAX_NODES + 1)), "hf")


def test_files_that_are_no_hostfile(tmp_path):
    (tmp_path / "latin1").write_bytes(b"n\xe9ud slots=1\n")
    with pytest.raises(BadInput, match="is not UTF-8 text"):
        read_hostfile(tmp_path / "latin1")
    with pytest.raises(BadInput, match="No such file"):
        read_hostfile(tmp_path / "absent")
    with pytest.raises(BadInput, match="is not a regular file"):
        read_hostfile(tmp_path)
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(BadInput, match="is not a regular file"):  # refused before it is opened: no block
        read_hostfile(tmp_path / "fifo")


def test_ssh_hosts_join_the_hostfile_once(tmp_path):
    (tmp_path / "hf").write_text("a slots=2\nb\n")
    assert [n.spec for n in nodes_of(tmp_path / "hf", ["b", "c", "c"])] == ["a", "b", "c"]
    with pytest.raises(BadInput):
        nodes_of(None, ["-oProxyCommand=x"])


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=400))
def test_any_text_parses_or_is_one_line_of_bad_input(text):
    try:
        nodes = parse_hostfile(text, "hf")
    except BadInput as exc:
        assert str(exc).startswith("hf")
        return
    assert nodes and len({n.spec for n in nodes}) == len(nodes)
    assert all(n.slots is None or 1 <= n.slots <= 4096 for n in nodes)
