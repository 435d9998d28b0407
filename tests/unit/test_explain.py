"""`explain` on real crash logs from public issue threads (tests/realworld/logs, each headed with its
source URL; truth.toml holds the cause each thread established): the failure class, the user's
innermost frame, the first library on the failing path and the command that confirms it. Then the
reader on what a log can be: ranks interleaved, ANSI colours, a traceback in a repr, cut tracebacks."""

from __future__ import annotations

import tomllib

import pytest

from dflashdoctor.commands.explain import ExplainOptions, explain
from dflashdoctor.explain.call_path import call_path
from dflashdoctor.explain.classes import NEEDLES, OTHER, SIGNALS, failing_traceback, failure_class
from dflashdoctor.explain.diagnosis import diagnose
from dflashdoctor.explain.reader import Reader
from tests.paths import ROOT

LOGS = ROOT / "tests" / "realworld" / "logs"
TRUTH = tomllib.loads((LOGS / "truth.toml").read_text())["logs"]
# code -> a corpus log that shows it (tests/unit/test_codes.py)
CASES = {
    "log-flex-dense": "01_olmo_flex_eager_oom.log",
    "log-autotuner-race": "04_mamba_dataparallel_replica_nargs.log",
    "log-triton-cache": "08_inductor_cached_autotune_jsondecode_ddp.log",
    "log-recompile-limit": "12_tacotron2_recompile_cache_limit.log",
    "log-out-of-resources": "14_flex_dim256_backendcompilerfailed_oor.log",
    "log-graph-break": "21_based_flash_attn_graph_break.log",
    "log-fla-kernel": "22_fla_gated_deltanet_triton23_dominance.log",
    "log-hf-flex-path": "26_transformers_ctrl_flex_blockmask_ndim.log",
    "log-other-failure": "33_word_lm_cuda_oom_batch_size.log",
    "log-cut-traceback": "03_specforge_dflash_blockmask_oom.log",
}


def _read(*texts: bytes):
    return Reader(SIGNALS, NEEDLES).feed(line for text in texts for line in text.split(b"\n"))


def _class(reading) -> str:
    found = failure_class(reading)
    return "none" if found is None else "other" if found is OTHER else found.code.removeprefix("log-")


@pytest.mark.parametrize("name", sorted(TRUTH))
def test_each_real_log_gets_its_class_user_frame_ranks_and_command(name):
    """`shows`: the class the text itself shows where it differs from the cause its thread found
    (two excerpts stop inside their traceback: what they show is a cut traceback, said as such)."""
    truth = TRUTH[name]
    diagnosis = diagnose(Reader(SIGNALS, NEEDLES).feed((LOGS / name).read_bytes().split(b"\n")))
    assert _class(diagnosis.reading) == truth.get("shows", truth["class"])
    path = diagnosis.path
    if truth["user_frame"]:
        assert path.user_frame is not None and path.user_frame.label().endswith(truth["user_frame"].rsplit("/", 1)[-1])
    else:
        assert path.user_frame is None or "site-packages" not in path.user_frame.path
    # the ranks the text shows failing, in the truth's order (a rank the thread names from a message
    # line alone, as 28's rank 3, is not shown failing)
    ranks = diagnosis.reading.ranks_first_failure_first()
    assert [r for r in truth["ranks_failed"] if r in ranks] == ranks and (ranks or not truth["ranks_failed"])
    confirm = diagnosis.confirm()
    if truth["confirm"] and "shows" not in truth:
        assert confirm.split()[:2] == ["dflashdoctor", truth["confirm"].split()[0]]
        if truth["user_frame"] and "SCRIPT" in truth["confirm"]:
            assert confirm.endswith(path.user_frame.path)
    if "thread" in truth:
        assert diagnosis.traceback.thread == truth["thread"] and f"thread {truth['thread']}" in diagnosis.story()


@pytest.mark.parametrize("code", sorted(CASES))
def test_each_code_says_the_command_that_confirms_it(code):
    report = explain(ExplainOptions(logs=[str(LOGS / CASES[code])]), ["explain"])
    (found,) = report.results[0].findings
    assert found.code == code and found.severity == "error" and found.fix
    truth = TRUTH[CASES[code]]
    confirm = truth["confirm"].split()[0] if truth["confirm"] and "shows" not in truth else ""
    assert (f"`dflashdoctor {confirm}" in found.fix) if confirm else "Confirm on your pipeline" not in found.fix
    assert report.exit_code() == 1


def test_ranks_ansi_and_a_repr_traceback_are_read_as_lines():
    log = (
        b"[rank1]: Traceback (most recent call last):\n"
        b'[rank1]:   File "/work/train.py", line 9, in step\n'
        b"\x1b[31m[rank1]: triton.runtime.errors.OutOfResources: out of resource: shared memory, Required: 9, "
        b"Hardware limit: 8\x1b[0m\n"
        b"[rank0]: {'message': 'Traceback (most recent call last):\\n  File \"/work/train.py\", line 4, in main\\n"
        b"RuntimeError: boom'}\n"
    )
    reading = _read(log)
    assert _class(reading) == "out-of-resources" and reading.failed_ranks == [1, 0]
    assert call_path(failing_traceback(reading)).user_frame.label() == "/work/train.py:9 in step"


def test_a_log_without_a_failure_passes(tmp_path):
    log = tmp_path / "train.log"
    log.write_text("".join(f"[rank0]: step {i} loss 2.{i:03d} lr 3e-4\n" for i in range(500)))
    report = explain(ExplainOptions(logs=[str(log)]), ["explain"])
    assert report.exit_code() == 0 and not report.results[0].findings


def test_torchruns_root_cause_goes_first_whatever_order_the_ranks_flushed_in():
    """Rank 0's consequence (a peer closed) is flushed before rank 1's own error; torchrun's summary,
    which times the failures, names rank 1: it goes first, and its traceback is the failure's."""
    log = (
        b"[default0]:[rank0]: Traceback (most recent call last):\n"
        b'[default0]:[rank0]:   File "/w/train.py", line 30, in <module>\n'
        b"[default0]:[rank0]: RuntimeError: Connection closed by peer [127.0.0.1]:1234\n"
        b"[default1]:[rank1]: Traceback (most recent call last):\n"
        b'[default1]:[rank1]:   File "/w/train.py", line 22, in <module>\n'
        b"[default1]:[rank1]: RuntimeError: boom\n"
        b"Root Cause (first observed failure):\n[0]:\n  time      : 2026-12-05_11:46:52\n"
        b"  rank      : 1 (local_rank: 1)\n"
    )
    diagnosis = diagnose(_read(log))
    assert diagnosis.reading.ranks_first_failure_first() == [1, 0]
    assert diagnosis.path.user_frame.line == 22 and diagnosis.exception == "RuntimeError: boom"
    closed = "RuntimeError: Connection closed by peer [127.0.0.1]:1234"
    assert diagnosis.ranks() == f"rank 1 (the error above); then rank 0: {closed}"


def test_a_threads_traceback_names_the_thread_and_the_doctors_own_frames_are_nobodys():
    log = (
        b"Exception in thread pair-0 (worker):\nTraceback (most recent call last):\n"
        b'  File "/w/train.py", line 8, in pair\n'
        b'  File "/venv/lib/python3.12/site-packages/dflashdoctor/hooks/flex_dense.py", line 390, in recording\n'
        b"TypeError: 'NoneType' object is not a mapping\n"
    )
    diagnosis = diagnose(_read(log))
    assert diagnosis.traceback.thread == "pair-0"
    assert diagnosis.path.user_frame.label() == "/w/train.py:8 in pair" and diagnosis.path.library == ""


def test_names_from_a_log_are_quoted_in_the_command_it_suggests():
    """A log is another's text: a frame path with a space and a `;` becomes one quoted argument, and a
    damaged cache file's root is named for `cache check`, quoted too."""
    log = (
        b"Traceback (most recent call last):\n"
        b'  File "/w/my dir/x; rm -rf ~.py", line 3, in step\n'
        b"RuntimeError: Failed to import /tmp/c d/wr/cwruqerddvgygrtuygr2yxfz6ktbzkyzedyyy6jfxxu3kp5puvlp.py\n"
    )
    diagnosis = diagnose(_read(log))
    assert diagnosis.found.code == "log-triton-cache"
    assert diagnosis.confirm() == "dflashdoctor cache check"  # the path with a space is not read whole: no root
    named = diagnose(_read(log.replace(b"/tmp/c d/", b"/tmp/c'd/")))
    assert named.confirm() == """dflashdoctor cache check --inductor-dir '/tmp/c'"'"'d'"""
    log = log.replace(b"Failed to import /tmp/c d/wr/c", b"out of resource: shared memory, Hardware limit: 9 /wr/c")
    assert diagnose(_read(log)).confirm() == "dflashdoctor check-compile '/w/my dir/x; rm -rf ~.py:step' --device cuda"
