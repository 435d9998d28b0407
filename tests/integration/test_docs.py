"""The documentation says what the code does: every finding code and exit code is documented,
docs/codes.md is the table in codes.py, the gate configuration example is one the gate accepts, the
README stays short, and nothing points at a file outside the repository."""

from __future__ import annotations

import subprocess

from dflashdoctor.codes import CODES, codes_markdown
from dflashdoctor.gate.config_file import load_config
from tests.paths import ROOT

README = ROOT / "README.md"


def test_docs_codes_is_written_from_the_codes_table():
    """Regenerate with `python3 -m dflashdoctor.codes > docs/codes.md`."""
    assert (ROOT / "docs" / "codes.md").read_text() == codes_markdown()
    assert all(f"| `{code}` |" in codes_markdown() for code in CODES)


def test_exit_codes_are_documented():
    text = README.read_text()
    for line in ("| 0 |", "| 1 |", "| 2 |", "| 3 |"):
        assert line in text


def test_the_readme_is_read_in_minutes_and_links_to_what_exists():
    text = README.read_text()
    assert len(text.encode()) < 10_000
    for page in ("docs/codes.md", "docs/architecture.md", "docs/output.md", "docs/known-hazards.md", "docs/testing.md"):
        assert page in text and (ROOT / page).is_file(), page
    for command in ("check-compile", "trace-attention", "race", "cache", "run", "gate", "env", "show", "init", "lint"):
        page = f"docs/commands/{command}.md"
        assert page in text and (ROOT / page).is_file(), page


def test_the_gate_configuration_example_loads(tmp_path):
    text = (ROOT / "docs" / "commands" / "gate.md").read_text()
    start = text.index("```toml\n[tool.dflashdoctor]") + len("```toml\n")
    (tmp_path / "pyproject.toml").write_text(text[start : text.index("```", start)])
    config, source = load_config(None, tmp_path)
    assert source.path == tmp_path / "pyproject.toml"
    assert config.check_compile.shape["kv_len"] == 10240 and config.budgets.max_graph_breaks == 0


def test_nothing_points_at_a_file_outside_the_repository():
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    outside = ("../shared", "DESIGN.md", "FACTS.md")
    pointing = [
        name
        for name in tracked
        if name.endswith((".py", ".md", ".toml", ".sh", ".txt", ".cfg"))
        and name != "tests/integration/test_docs.py"
        and any(word in (ROOT / name).read_text(errors="replace") for word in outside)
    ]
    assert pointing == []
