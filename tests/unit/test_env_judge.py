"""env's judge on recorded observations: hazards set, FLA's kernels here, bytecode, cache places."""

from __future__ import annotations

import pytest

from dflashdoctor.redaction import redact_argv, redact_text, redact_variables
from tests.unit.recorded import documented, found, judged, raw

CASES = {
    "env-hazard": "cpu/env-hazard",
    "kernel-unavailable": "h200/env-fla",
    "bytecode-not-cached": "h200/env-fla",
}


@pytest.mark.parametrize("code", CASES)
def test_each_finding_from_a_recorded_run(code):
    (finding, *_) = documented(judged(CASES[code]), code)
    assert finding.fix


def test_the_hazard_names_the_variable_and_its_value():
    (hazard,) = found(judged("cpu/env-hazard"), "env-hazard")
    assert hazard.evidence == {"variable": "TORCHDYNAMO_DISABLE", "value": "1"}


def test_fla_guard_on_hopper_is_named_without_running_a_model():
    (result,) = judged("h200/env-fla")
    guards = [f for f in found([result], "kernel-unavailable") if f.where is not None]
    assert guards and all(f.where.file.endswith(".py") and f.where.line for f in guards)
    assert next(c for c in result.checks if c.name == "fla kernels").status == "warn"


def test_fla_on_a_cpu_cannot_run_and_says_why():
    (note,) = found(judged("cpu/env-hazard"), "kernel-unavailable")
    assert note.evidence["platform"] == "cpu" and not note.evidence["usable"]


def test_a_cache_root_on_a_network_filesystem():
    roots = [{**raw("cpu/env-hazard")["cache_roots"][0], "filesystem": "nfs4", "network_filesystem": True}]
    (shared,) = found(judged("cpu/env-hazard", cache_roots=roots), "cache-shared-filesystem")
    assert shared.severity == "warning" and roots[0]["path"] in shared.title


@pytest.mark.parametrize(
    ("variables", "kept"),
    [
        ({"HF_TOKEN": "hf_abc"}, {"HF_TOKEN": "<redacted>"}),
        ({"HF_ENDPOINT": "https://user:pass@host/x"}, {"HF_ENDPOINT": "https://<redacted>@host/x"}),
        ({"TORCH_EXTENSIONS_DIR": "/opt/ext"}, {"TORCH_EXTENSIONS_DIR": "/opt/ext"}),
    ],
)
def test_secret_variables_are_redacted(variables, kept):
    assert redact_variables(variables) == kept


@pytest.mark.parametrize(
    ("argv", "kept"),
    [
        (
            ["train.py", "--hf-token", "abc", "--max-tokens", "5"],
            ["train.py", "--hf-token", "<redacted>", "--max-tokens", "5"],
        ),
        (["train.py", "--api-key=abc", "--sort-key", "a"], ["train.py", "--api-key=<redacted>", "--sort-key", "a"]),
        (["env", "HF_TOKEN=abc", "EPOCHS=3", "python"], ["env", "HF_TOKEN=<redacted>", "EPOCHS=3", "python"]),
        (
            ["--push", "https://bob:pw@hf.co/x?token=t&a=1"],
            ["--push", "https://<redacted>@hf.co/x?token=<redacted>&a=1"],
        ),
        (["ghp_0123456789abcdef", "--password"], ["<redacted>", "--password"]),  # a last secret option: nothing to take
    ],
)
def test_a_command_line_keeps_no_secret(argv, kept):
    assert redact_argv(argv) == kept


def test_text_keeps_no_token_shaped_word():
    text = "401 for https://u:p@hf.co with hf_abcdefghijkl, sk-abcdefghijklmnop and AKIAABCDEFGHIJKLMNOP; hf_ok"
    assert redact_text(text) == "401 for https://<redacted>@hf.co with <redacted>, <redacted> and <redacted>; hf_ok"
