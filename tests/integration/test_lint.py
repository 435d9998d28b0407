"""`dflashdoctor lint` as a team runs it: the CLI on the planted folder (every planted pattern found
at its line, in SARIF) and its healthy twin (exit codes), on the installed transformers and torch
packages (no finding: the rules never fire on their own integration, threads and dynamic=False
included), without torch importable, and on bad input: files in other encodings, files the parser
runs out of stack on (init's scan too), paths too long. Lint runs in the doctor's own process: these
run it in this one (run_cli_here); the one without torch, and the ones on input that could crash a
parser, run a real, fresh interpreter."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import run_cli, run_cli_here
from tests.paths import TARGETS

LINT = TARGETS / "lint"
# the marker on each planted line -> the code that must be found there (tests/targets/lint/faulty)
PLANTED = {
    "RAW_CALL": "lint-raw-flex-call",
    "DISABLED_CALL": "lint-raw-flex-call",
    "EAGER_WRAPPER": "lint-wrapper-not-inductor",
    "REBOUND_LINE": "lint-wrapper-rebound",
    "GLOBAL_READ": "lint-mod-reads-global",
    "STATIC_WRAPPER": "lint-wrapper-static-varying",
    "STATIC_DECORATED": "lint-wrapper-static-varying",
    "POOL_STEP": "lint-threaded-model-call",
    "THREAD_KERNEL": "lint-threaded-model-call",
}


def _planted() -> set[tuple[str, str, int]]:
    """(code, file name, line) of every marked line in the planted folder."""
    found = set()
    for path in (LINT / "faulty").glob("*.py"):
        for number, text in enumerate(path.read_text().splitlines(), 1):
            found |= {(code, path.name, number) for marker, code in PLANTED.items() if f"# {marker}" in text}
    return found


def _faulty(tmp_path: Path) -> Path:
    """The planted folder, copied out of this repository: inside it, the folder is under tests/,
    where raw calls are on purpose (lint-raw-flex-call-on-purpose, off by default)."""
    copy = tmp_path / "faulty"
    shutil.copytree(LINT / "faulty", copy)
    return copy


def test_the_planted_folder_fails_with_each_finding_at_its_line_in_sarif(tmp_path):
    result = run_cli_here(tmp_path, "lint", str(_faulty(tmp_path)), "--json")
    assert result.code == 1, result.stderr
    assert sorted(f["code"] for f in result.findings()) == sorted(PLANTED.values())
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
    assert places == _planted() and len(places) == len(PLANTED)


def test_the_real_torchtune_wrapper_case_fires_at_its_dynamic_false_compile(tmp_path):
    """tests/realworld/packed_static.py: torchtune's wrapper, packed lengths that grow each step;
    check-compile and run see it recompile, then run dense (test_realworld.py)."""
    case = TARGETS.parent / "realworld" / "packed_static.py"
    static = "flex_attention_compiled = torch.compile(flex_attention, dynamic=False)"
    line = next(i for i, t in enumerate(case.read_text().splitlines(), 1) if t.strip() == static)
    result = run_cli_here(tmp_path, "lint", str(case), "--json")
    assert result.code == 1, result.stderr  # a warning is a finding: a linter exits 1
    assert [(f["code"], f["where"]["line"]) for f in result.findings()] == [("lint-wrapper-static-varying", line)]


def test_the_healthy_twin_passes(tmp_path):
    result = run_cli_here(tmp_path, "lint", str(LINT / "healthy"), "--json")
    assert result.code == 0 and result.findings() == [], result.stdout[-2000:]


@pytest.mark.parametrize("package", ["transformers", "torch"])
def test_no_finding_on_the_installed_package(tmp_path, package):
    module = pytest.importorskip(package)
    result = run_cli_here(tmp_path, "lint", os.path.dirname(module.__file__), "--json")
    assert result.code == 0 and result.findings() == [], [f["where"] for f in result.findings()][:5]
    assert result.report["results"][0]["measurements"]["files"] > 1000


def test_lint_runs_where_torch_cannot_be_imported(tmp_path):
    program = (
        "import runpy, sys; sys.modules['torch'] = None; "  # `import torch` now raises ImportError
        f"sys.argv = ['dflashdoctor', 'lint', {str(_faulty(tmp_path))!r}, '--json', '--report-dir', 'r']; "
        "runpy.run_module('dflashdoctor', run_name='__main__')"
    )
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert done.returncode == 1, done.stderr[-2000:]
    assert len(json.loads(done.stdout)["results"][0]["findings"]) == len(PLANTED)


def test_a_path_that_is_not_there_is_one_line_and_exit_2(tmp_path):
    result = run_cli_here(tmp_path, "lint", "no/such/folder")
    assert result.code == 2 and result.stderr.strip() == "dflashdoctor: no such file or folder: no/such/folder"


def test_a_file_that_is_not_python_is_counted_not_a_crash(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "broken.py").write_bytes(
        b"from torch.nn.attention.flex_attention import flex_attention\ndef (:\n"
    )
    (tmp_path / "src" / "latin.py").write_bytes(b"# flex_attention \xff\n")
    result = run_cli_here(tmp_path, "lint", "src", "--json")
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
    result = run_cli_here(tmp_path, "lint", path)
    assert result.code == 2 and said in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_a_fifo_inside_the_tree_is_counted_never_read(tmp_path):
    (tmp_path / "src").mkdir()
    os.mkfifo(tmp_path / "src" / "waits.py")  # opening it for reading would block forever
    result = run_cli_here(tmp_path, "lint", "src", "--json")
    assert result.code == 0 and result.report["results"][0]["measurements"]["unparsed"] == [str(Path("src/waits.py"))]


_IMPORT = b"import torch\nfrom torch.nn.attention.flex_attention import flex_attention\n"
_RAW_CALL = _IMPORT + b"def attend(q, k, v):\n    return flex_attention(q, k, v)\n"
# Expressions CPython's parser refuses with MemoryError (its own stack), not SyntaxError.
TOO_DEEP = {"minus": b"-" * 1_000_000 + b"1", "not": b"not " * 300_000 + b"1", "lambda": b"lambda:" * 50_000 + b"1"}


@pytest.mark.parametrize("expression", TOO_DEEP.values(), ids=TOO_DEEP)
def test_a_file_the_parser_runs_out_of_stack_on_is_unparsed_like_a_syntax_error(tmp_path, expression):
    """`lint` and `init` read it (it names flex_attention and compiles it) and went on to exit 3,
    `internal error: MemoryError`. It is a file they cannot parse, as a syntax error is: lint lists
    it and still judges the files beside it; init says what the others say. A real child process:
    the input is one a parser could crash on."""
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "deep.py").write_bytes(_IMPORT + b"wrapper = torch.compile(flex_attention)\nx = " + expression)
    (tmp_path / "src" / "raw.py").write_bytes(_RAW_CALL)
    (tmp_path / "src" / "model.py").write_bytes(_IMPORT + b"compiled = torch.compile(flex_attention)\n")
    result = run_cli(tmp_path, "lint", "src", "--json", timeout=120)
    assert result.code == 1 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert [(f["code"], f["where"]["file"]) for f in result.findings()] == [("lint-raw-flex-call", "src/raw.py")]
    assert result.report["results"][0]["measurements"]["unparsed"] == ["src/deep.py"]
    init = subprocess.run(
        [sys.executable, "-m", "dflashdoctor", "init", "src"], capture_output=True, text=True, cwd=tmp_path, timeout=120
    )
    assert init.returncode == 0 and init.stderr == "", init.stderr[-2000:]
    assert 'target = "model.py:compiled"' in init.stdout and "deep.py" not in init.stdout


ENCODED = {  # a file's bytes -> whether Python reads it (as `python file.py` would)
    "bom": (b"\xef\xbb\xbf" + _RAW_CALL, True),
    "latin-1 cookie": (b"# -*- coding: latin-1 -*-\n" + _RAW_CALL + b"    # caf\xe9\n", True),
    "cookie on line 2": (b"#!/usr/bin/env python\n# vim: set fileencoding=cp1252 :\n" + _RAW_CALL + b"# \x93\n", True),
    "not utf-8": (_RAW_CALL + b"# caf\xe9\n", False),
    "bom and latin-1 cookie": (b"\xef\xbb\xbf# coding: latin-1\n" + _RAW_CALL, False),
    "unknown codec": (b"# coding: no-such-codec\n" + _RAW_CALL, False),
    "no text codec": (b"# coding: hex\n" + _RAW_CALL, False),
    "nul byte": (_RAW_CALL + b"x = 1\x00\n", False),
}


@pytest.mark.parametrize(("data", "python_reads_it"), ENCODED.values(), ids=ENCODED)
def test_source_is_decoded_as_python_decodes_it(tmp_path, data, python_reads_it):
    """Read as UTF-8, a file with a byte-order mark held an invalid character (U+FEFF) and one with a
    coding cookie could not be decoded: both were listed unparsed and their raw call never seen
    (exit 0). Whatever Python itself would refuse to run is listed as a syntax error is."""
    (tmp_path / "attend.py").write_bytes(data)
    runs = subprocess.run([sys.executable, "attend.py"], capture_output=True, cwd=tmp_path, timeout=60)
    assert (runs.returncode == 0) == python_reads_it, runs.stderr  # the ground truth: Python's own reading
    result = run_cli_here(tmp_path, "lint", "attend.py", "--json")
    assert "Traceback" not in result.stderr, result.stderr
    section = result.report["results"][0]
    if python_reads_it:
        assert result.code == 1 and [(f["code"], f["where"]["line"]) for f in result.findings()] == [
            ("lint-raw-flex-call", data.splitlines().index(b"    return flex_attention(q, k, v)") + 1)
        ]
    else:
        assert result.code == 0 and section["measurements"]["unparsed"] == ["attend.py"]


def test_init_finds_a_wrapper_in_a_file_with_a_byte_order_mark_or_a_cookie(tmp_path, main_here):
    """init's scan decoded with UTF-8 too: the wrapper of a file written with a BOM was not found."""
    (tmp_path / "bom.py").write_bytes(b"\xef\xbb\xbf" + _IMPORT + b"compiled = torch.compile(flex_attention)\n")
    (tmp_path / "latin.py").write_bytes(b"# coding: latin-1\n" + _IMPORT + b"other = torch.compile(flex_attention)\n")
    said = main_here("init", str(tmp_path))
    assert said.returncode == 0 and said.stderr == "", said.stderr
    assert 'target = "bom.py:compiled"' in said.stdout
    assert "# another compiled flex_attention wrapper: latin.py:other (latin.py:4)" in said.stdout


@pytest.mark.parametrize("name", ["a" * 300, "a/" * 3000], ids=["name-too-long", "path-too-long"])
def test_a_path_too_long_for_the_system_is_one_line_and_exit_2(tmp_path, name):
    """Path.exists() raised ENAMETOOLONG, which it does not take for "not there": exit 3."""
    result = run_cli_here(tmp_path, "lint", name)
    assert result.code == 2 and result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith(f"dflashdoctor: cannot read {name[:20]}") and "File name too long" in result.stderr
