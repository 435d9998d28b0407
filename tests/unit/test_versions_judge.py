"""versions' judge on recorded runs: this CPU's stack, a virtual environment over it whose own
tokenizers (0.22.1, installed into it) and setuptools (the one venv seeds) are not the versions
transformers and torch require, and this stack under a made einops whose metadata is not UTF-8 and a
made kernels whose requirements hold 5,000-digit versions."""

from __future__ import annotations

import pytest

from tests.unit.recorded import documented, found, judged, observations

CASES = {"requirement-unmet": "cpu/versions-unmet", "package-metadata-unreadable": "cpu/versions-unreadable"}


@pytest.mark.parametrize("code", CASES)
def test_each_finding_from_a_recorded_run(code):
    (finding, *_) = documented(judged(CASES[code]), code)
    assert finding.fix.startswith("pip install ")


def test_a_package_whose_metadata_cannot_be_read_is_named_and_what_needs_it_left_unchecked():
    (result,) = judged("cpu/versions-unreadable")
    assert [(f.code, f.title) for f in result.findings] == [
        (
            "package-metadata-unreadable",
            "einops's installed metadata cannot be read: UnicodeDecodeError: 'utf-8' codec can't decode byte "
            "0xe9 in position 62: invalid continuation byte",
        )
    ]
    assert result.findings[0].fix == "pip install --force-reinstall --no-deps einops"
    assert [(c.name, c.status, c.summary) for c in result.checks] == [
        ("metadata", "warn", "cannot be read for einops"),
        ("requirements", "pass", "18 of 21 requirements hold; 3 could not be checked"),
    ]


def test_each_unmet_requirement_is_named_with_what_is_installed():
    (result,) = judged("cpu/versions-unmet")
    titles = sorted(f.title for f in found([result], "requirement-unmet"))
    assert titles == [
        "tokenizers 0.22.1 requires huggingface-hub>=0.16.4,<2.0, but 2.4.0 is installed",
        "torch 2.13.0+cpu requires setuptools>=77.0.3, but 65.5.0 is installed",
        "transformers 5.25.0 requires tokenizers<0.24.0,>=0.23.1, but 0.22.1 is installed",
    ]
    (tokenizers,) = [f for f in result.findings if f.title.startswith("transformers")]
    assert "refuses to import" in tokenizers.detail and tokenizers.fix.startswith("pip install 'tokenizers<0.24.0")
    (check,) = result.checks
    assert (check.status, check.summary) == ("warn", "3 of 23 unmet")


def test_the_stack_that_holds_passes_with_its_table():
    (result,) = judged("cpu/versions-healthy")
    assert result.status == "pass" and not result.findings
    (table,) = result.tables
    assert [row[0] for row in table.rows][:2] == ["torch", "triton"]
    assert result.measurements["packages"]["torch"].startswith("2.")


def test_without_packaging_the_requirements_are_listed_unchecked():
    (result,) = judged("cpu/versions-unmet", packaging=None)
    (check,) = result.checks
    assert check.status == "skip" and not result.findings
    assert observations("cpu/versions-unmet").packages[0]["name"] == "torch"
