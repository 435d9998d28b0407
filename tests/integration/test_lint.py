"""`dflashdoctor lint` as a team runs it: the CLI on the planted folder and its healthy twin (exit
codes, SARIF with file and line), on the installed transformers and torch packages (no finding: the
rules never fire on their own integration), without torch importable, and on bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.paths import TARGETS

LINT = TARGETS / "lint"


def test_the_planted_folder_fails_with_each_finding_at_its_line_in_sarif(tmp_path):
    result = run_cli(tmp_path, "lint", str(LINT / "faulty"), "--json")
    assert result.code == 1, result.stderr
    assert sorted(f["code"] for f in result.findings()) == [
        "lint-mod-reads-global",
        "lint-raw-flex-call",
        "lint-raw-flex-call",
        "lint-wrapper-not-inductor",
        "lint-wrapper-rebound",
    ]
    sarif = json.loads((result.report_dir / "report.sarif").read_text())
    places = {
        (
            r["ruleId"],
            Path(loc["physicalLocation"]["artifactLocation"]["uri"]).name,
            loc["physicalLocation"]["region"]["startLine"],
        )
        for r in sarif["runs"][0]["results"]
        for loc in r["locations"]
    }
    assert ("lint-wrapper-rebound", "rebound.py", 14) in places and ("lint-raw-flex-call", "raw_call.py", 9) in places


def test_the_healthy_twin_passes(tmp_path):
    result = run_cli(tmp_path, "lint", str(LINT / "healthy"), "--json")
    assert result.code == 0 and result.findings() == [], result.stdout[-2000:]


@pytest.mark.parametrize("package", ["transformers", "torch"])
def test_no_finding_on_the_installed_package(tmp_path, package):
    module = pytest.importorskip(package)
    result = run_cli(tmp_path, "lint", os.path.dirname(module.__file__), "--json", timeout=300)
    assert result.code == 0 and result.findings() == [], [f["where"] for f in result.findings()][:5]
    assert result.report["results"][0]["measurements"]["files"] > 1000


def test_lint_runs_where_torch_cannot_be_imported(tmp_path):
    program = (
        "import runpy, sys; sys.modules['torch'] = None; "  # `import torch` now raises ImportError
        f"sys.argv = ['dflashdoctor', 'lint', {str(LINT / 'faulty')!r}, '--json', '--report-dir', 'r']; "
        "runpy.run_module('dflashdoctor', run_name='__main__')"
    )
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert done.returncode == 1, done.stderr[-2000:]
    assert len(json.loads(done.stdout)["results"][0]["findings"]) == 5


def test_a_path_that_is_not_there_is_one_line_and_exit_2(tmp_path):
    result = run_cli(tmp_path, "lint", "no/such/folder")
    assert result.code == 2 and result.stderr.strip() == "dflashdoctor: no such file or folder: no/such/folder"


def test_a_file_that_is_not_python_is_counted_not_a_crash(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "broken.py").write_bytes(
        b"from torch.nn.attention.flex_attention import flex_attention\ndef (:\n"
    )
    (tmp_path / "src" / "latin.py").write_bytes(b"# flex_attention \xff\n")
    result = run_cli(tmp_path, "lint", "src", "--json")
    assert result.code == 0, result.stderr
    assert sorted(Path(p).name for p in result.report["results"][0]["measurements"]["unparsed"]) == [
        "broken.py",
        "latin.py",
    ]


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_a_fifo_or_a_device_given_as_a_path_is_named_and_exit_2(tmp_path, kind):
    if kind == "fifo":
        os.mkfifo(tmp_path / "pipe.py")
        path, said = "pipe.py", "is a FIFO"
    else:
        path, said = "/dev/zero", "is a character device"
    result = run_cli(tmp_path, "lint", path, timeout=60)
    assert result.code == 2 and said in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_a_fifo_inside_the_tree_is_counted_never_read(tmp_path):
    (tmp_path / "src").mkdir()
    os.mkfifo(tmp_path / "src" / "waits.py")  # opening it for reading would block forever
    result = run_cli(tmp_path, "lint", "src", "--json", timeout=60)
    assert result.code == 0 and result.report["results"][0]["measurements"]["unparsed"] == [str(Path("src/waits.py"))]
