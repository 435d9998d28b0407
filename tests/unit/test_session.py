"""What a probe that never reported becomes: a probe-crashed section, whatever it left behind, and
a report whose verdict is `error` (exit 3) however the other sections went."""

from __future__ import annotations

import signal

import pytest

from dflashdoctor.errors import BadInput, MissingPackage
from dflashdoctor.report import Report
from dflashdoctor.runner import ProbeRun
from dflashdoctor.session import crash_result, new_report, probe_error_result, probe_payload
from tests.unit.recorded import judged

CASES = {"probe-crashed": "a probe killed by a signal, timed out, or failing in its own code"}

_STACKS = 'Thread 0x7f (most recent call first):\n  File "/x/train.py", line 12 in step\n'


@pytest.mark.parametrize(
    ("run", "said"),
    [
        (ProbeRun("check-compile", 45.0, None, timed_out=True, stderr_tail=_STACKS), "timed out after 45 s"),
        (ProbeRun("race", 3.2, -signal.SIGKILL), "killed by signal 9"),
        (ProbeRun("env", 0.4, 1, stderr_tail="Segmentation fault"), "exited with status 1"),
    ],
)
def test_each_way_a_probe_dies_is_one_probe_crashed_finding(run, said):
    result = crash_result(run)
    (crash,) = result.findings
    assert crash.code == "probe-crashed" and crash.severity == "error" and said in crash.title
    assert result.status == "error" and crash.evidence["stderr_tail"] == run.stderr_tail


def test_a_crash_outranks_every_failure_in_the_report():
    report = Report(command="gate", argv=[], started="now", results=[*judged("cpu/check-compile-raw-call")])
    report.results.append(crash_result(ProbeRun("race", 1.0, -signal.SIGSEGV)))
    report.settle_verdict()
    assert report.verdict == "error" and report.exit_code() == 3


def test_a_probe_failing_in_its_own_code_is_our_bug_with_its_traceback():
    payload = {"probe_error": "KeyError: 'shape'", "traceback": "Traceback (most recent call last): ..."}
    (crash,) = probe_error_result(ProbeRun("trace-attention", 2.0, 0), payload).findings
    assert "KeyError" in crash.title and crash.evidence["traceback"].startswith("Traceback")


def test_what_the_probed_side_refused_is_bad_input_not_a_crash():
    with pytest.raises(MissingPackage) as missing:
        probe_payload(ProbeRun("race", 1.0, 0, payload={"missing_package": "triton", "usage_error": "no triton"}), "py")
    assert missing.value.package == "triton"
    with pytest.raises(BadInput):
        probe_payload(ProbeRun("race", 1.0, 0, payload={"usage_error": "--kernel x: no such module"}), "py")
    died = ProbeRun("env", 1.0, 1, stderr_tail="Traceback...\nModuleNotFoundError: No module named 'torch'")
    with pytest.raises(MissingPackage):
        probe_payload(died, "/usr/bin/python3")


def test_a_new_report_says_which_doctor_made_it():
    report = new_report("env", ["dflashdoctor", "env"])
    assert report.environment["dflashdoctor"] and report.verdict == "pass" and not report.observations


def test_a_probe_output_tail_is_read_from_the_end(tmp_path):
    """A probe that wrote gigabytes: the tail is read by seeking, not by reading the file (a sparse
    file of 64 GiB here, which would not fit in memory)."""
    from dflashdoctor.processes import output_tail

    capture = tmp_path / "stderr"
    with open(capture, "wb") as handle:
        handle.truncate(64 << 30)
        handle.seek(0, 2)
        handle.write(b"last words \xff\n")
    assert output_tail(capture, 12) == "ast words \ufffd\n"
    assert output_tail(tmp_path / "missing", 12) == ""
