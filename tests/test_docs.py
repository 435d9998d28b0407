"""The README documents every finding code and every exit code the tool can produce, and its gate
configuration example is one the gate accepts."""

from __future__ import annotations

from pathlib import Path

from dflashdoctor.codes import CODES
from dflashdoctor.gate.config import load_config

README = Path(__file__).parent.parent / "README.md"


def test_every_finding_code_is_documented():
    text = README.read_text()
    missing = [code for code in CODES if f"`{code}`" not in text]
    assert missing == []


def test_exit_codes_are_documented():
    text = README.read_text()
    for line in ("| 0 |", "| 1 |", "| 2 |", "| 3 |"):
        assert line in text


def test_the_gate_configuration_example_loads(tmp_path):
    text = README.read_text()
    start = text.index("```toml\n[tool.dflashdoctor]") + len("```toml\n")
    (tmp_path / "pyproject.toml").write_text(text[start : text.index("```", start)])
    config, source = load_config(None, tmp_path)
    assert source == str(tmp_path / "pyproject.toml")
    assert config.shape["kv_len"] == 10240 and config.max_graph_breaks == 0
