"""check-compile end to end on the CPU: the healthy reference passes, each planted fault is named.

Every case runs the real CLI in a child process, which runs the probe in a grandchild: dynamo state
(recompile limits, skipped frames) cannot leak between tests.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.paths import TARGETS

FAULTS = "dflashdoctor.reference.faults"
ENTRY = "flex_attention_forward"
REPORT_FILES = {"report.json", "report.html", "report.md", "junit.xml", "report.sarif", "observations.json"}


def test_healthy_reference_passes(cli_here):
    run = cli_here("check-compile", "--device", "cpu")
    assert run.code == 0, run.stdout + run.stderr
    assert {p.name for p in run.report_dir.iterdir()} == REPORT_FILES
    report = run.report
    assert report["verdict"] == "pass"
    assert run.check("target")["status"] == "pass"
    assert run.check("forward")["status"] == "pass"
    assert run.check("numerics")["status"] == "pass"
    assert run.check("varying lengths")["status"] == "pass"
    assert run.codes() == {"backward-not-checked"}
    measurements = report["results"][0]["measurements"]
    assert measurements["dense_forward_calls"] == 0
    assert measurements["out_rel_err"] < 1e-3
    assert len(measurements["vary"]) == 10
    assert measurements["recompiles"] <= 2
    assert "PASS" in run.stdout


def test_raw_call_runs_dense_forward_with_call_site(cli_here):
    run = cli_here("check-compile", f"{FAULTS}.raw_call:{ENTRY}", "--device", "cpu", "--vary", "2")
    assert run.code == 1
    (dense,) = run.findings("dense-forward")
    assert dense["where"]["file"].endswith("raw_call.py")
    assert dense["where"]["function"] == ENTRY
    assert dense["evidence"]["dense_forward_calls"] >= 4
    assert dense["evidence"]["first_event"]["score_matrix_bytes"] == 1 * 8 * 256 * 1280 * 4
    assert run.check("forward")["status"] == "fail"


def _line_of(path: Path, text: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if text in line)


def test_rebound_wrapper_is_not_compiled(cli_here):
    import dflashdoctor.reference.faults.rebound as rebound

    run = cli_here("check-compile", f"{FAULTS}.rebound:{ENTRY}", "--device", "cpu", "--vary", "0")
    assert run.code == 1
    (not_compiled,) = run.findings("not-compiled")
    source = Path(rebound.__file__)
    assert not_compiled["where"]["file"] == str(source)
    assert not_compiled["where"]["line"] == _line_of(source, "_compiled_flex_attention = flex_attention")
    assert "_compiled_flex_attention" in not_compiled["title"]


def test_attribute_bound_to_raw_flex_is_not_compiled(cli_here):
    run = cli_here("check-compile", f"{FAULTS}.rebound:_compiled_flex_attention", "--device", "cpu", "--vary", "0")
    assert run.code == 1
    assert "not-compiled" in run.codes()
    assert "dense-forward" in run.codes()


def test_global_int_in_score_mod_hits_recompile_limit(cli_here):
    run = cli_here("check-compile", f"{FAULTS}.global_length:{ENTRY}", "--device", "cpu", "--vary", "12")
    assert run.code == 1
    (fallback,) = run.findings("recompile-limit-fallback")
    assert "valid_kv_len" in fallback["evidence"]["guard"]
    assert fallback["evidence"]["recompile_limit"] == 8
    assert fallback["where"]["file"].endswith("global_length.py")
    assert fallback["where"]["function"] == "_mask_padding"
    assert fallback["evidence"]["dense_forward_calls"] >= 1
    assert "recompile_limit" in fallback["detail"]
    assert run.check("varying lengths")["status"] == "fail"


def test_exception_in_compiled_frame_poisons_it(cli_here):
    run = cli_here("check-compile", f"{FAULTS}.retried_call:{ENTRY}", "--device", "cpu", "--vary", "2")
    assert run.code == 1
    (skip,) = run.findings("dynamo-skip-fallback")
    assert skip["evidence"]["exception"].startswith("ValueError(")
    assert "enable_gqa" in skip["evidence"]["exception"]
    assert skip["where"]["file"].endswith("retried_call.py")
    assert "dense-forward" not in run.codes()  # the cause is named instead


def test_file_target_with_compiled_wrapper(cli_here, tmp_path):
    target = TARGETS / "compiled_wrapper.py"
    run = cli_here("check-compile", f"{target}:compiled_flex", "--device", "cpu", "--vary", "0", "--mask", "causal")
    assert run.code == 0, run.stdout + run.stderr
    assert "torch.compile wrapper of" in run.check("target")["summary"]
    assert run.report["results"][0]["measurements"]["target_kind"] == "compiled-wrapper"


def test_wrapper_compiled_without_inductor_runs_dense(cli_here):
    target = TARGETS / "compiled_wrapper.py"
    run = cli_here("check-compile", f"{target}:debug_compiled_flex", "--device", "cpu", "--vary", "0")
    assert run.code == 1
    assert run.check("target")["status"] == "fail"
    (dense,) = run.findings("dense-forward")
    assert "backend='aot_eager'" in dense["detail"]
    assert dense["where"] == {
        "file": str(target),
        "line": _line_of(target, "debug_compiled_flex ="),
        "function": None,
        "module": "dflashdoctor_target_compiled_wrapper",
    }


def test_probe_runs_under_the_interpreter_given(cli_here):
    import sys

    run = cli_here("check-compile", "--device", "cpu", "--vary", "0", "--python", sys.executable)
    assert run.code == 0, run.stdout + run.stderr
    assert run.report["environment"]["python"] == ".".join(map(str, sys.version_info[:3]))


def test_module_target_resolves_from_the_current_folder(cli_here, tmp_path):
    package = tmp_path / "mypkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "attn.py").write_text(
        "import torch\nfrom torch.nn.attention.flex_attention import flex_attention\n"
        "compiled = torch.compile(flex_attention)\n"
    )
    run = cli_here("check-compile", "mypkg.attn:compiled", "--device", "cpu", "--vary", "0", "--mask", "causal")
    assert run.code == 0, run.stdout + run.stderr
    assert run.check("target")["status"] == "pass"


def test_json_output_is_the_report_and_nothing_else(cli_here):
    run = cli_here("check-compile", "--device", "cpu", "--vary", "0", "--json")
    assert run.code == 0
    import json

    assert json.loads(run.stdout) == run.report


def test_target_that_raises_is_a_finding(cli_here):
    target = TARGETS / "bad_inputs.py"
    run = cli_here("check-compile", f"{target}:raises", "--device", "cpu")
    assert run.code == 1
    (raised,) = run.findings("target-raised")
    assert "attention backend not initialised" in raised["detail"]
    assert raised["where"]["function"] == "raises"


@pytest.mark.parametrize(
    ("attr", "timeout", "expect"),
    [("killed_by_signal", "600", "signal 9"), ("hangs", "45", "timed out")],
)
def test_probe_killed_or_hung_is_probe_crashed(cli_here, attr, timeout, expect):
    target = TARGETS / "bad_inputs.py"
    run = cli_here("check-compile", f"{target}:{attr}", "--device", "cpu", "--timeout", timeout)
    assert run.code == 3
    (crash,) = run.findings("probe-crashed")
    assert expect in crash["title"]
    assert run.report["verdict"] == "error"
    if attr == "hangs":  # the stacks were dumped before the kill
        assert "in hangs" in crash["evidence"]["stderr_tail"]
