"""`show` renders a saved report.json again: the committed H200 reports come back as they were
written, a fresh report's every file is reproduced, and anything that is not a report is one line of
bad input, whatever its bytes. `show` runs in this process (main_here), and once more in a real child."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dflashdoctor import cli
from dflashdoctor.commands.show import show
from dflashdoctor.errors import BadInput
from dflashdoctor.render import FILES
from dflashdoctor.report import SCHEMA
from tests import cache_tree
from tests.paths import ROOT

EXAMPLES = sorted((ROOT / "reports" / "examples").glob("*/report.json"))
# Markdown written before `<` was escaped, and SARIF's base URI (the folder it is rendered in), differ
# from a rendering made now; HTML and JUnit come back byte for byte, and the JSON with each section's
# `tables` and `subject` added (made from the measurements those reports kept).
REPRODUCED = ("report.html", "junit.xml")
ADDED_SINCE = ("tables", "subject", "plots")


def _show(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """`show` in a real child process (the other tests run it in this one: main_here)."""
    return subprocess.run(
        [sys.executable, "-m", "dflashdoctor", "show", *args], capture_output=True, text=True, cwd=cwd, timeout=120
    )


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.parent.name for p in EXAMPLES])
def test_the_committed_gpu_reports_render_again_as_written(path):
    for name in REPRODUCED:
        if (path.parent / name).exists():
            assert show(path, FILES[name], verbose=False) == (path.parent / name).read_text(encoding="utf-8"), name
    again, written = json.loads(show(path, "json", verbose=False)), json.loads(path.read_text(encoding="utf-8"))
    if "causes" not in written:  # written before the findings were grouped by cause: show adds them
        findings = sum(len(result["findings"]) for result in written["results"])
        assert sum(cause["count"] for cause in again.pop("causes")) == findings
    for section, as_written in zip(again["results"], written["results"], strict=True):
        assert all(key in section for key in ADDED_SINCE)
        if "plots" not in as_written:  # written before judges made charts, plots and row links: show adds them
            section["comparisons"] = section["comparisons"][: len(as_written.get("comparisons", []))]
            for comparison in section["comparisons"]:
                for bar in comparison["bars"]:
                    assert bar.pop("note") == ""
            for table in section.get("tables", []):
                table.pop("row_sites")
        for key in set(ADDED_SINCE) - set(as_written):
            del section[key]
    assert again == written


def test_every_file_of_a_fresh_report_is_reproduced(cli_here, main_here, tmp_path):
    cache_tree.healthy_tree(tmp_path / "triton", 2)
    run = cli_here("cache", "check", "--triton-dir", str(tmp_path / "triton"))
    assert run.code == 0, run.stdout + run.stderr
    saved = run.report_dir / "report.json"
    for name, format_name in FILES.items():
        shown = main_here("show", str(saved), "--format", format_name, cwd=tmp_path)  # rendered where it was made
        assert shown.returncode == 0 and shown.stdout == (run.report_dir / name).read_text(), name
    terminal = main_here("show", str(saved), cwd=tmp_path)
    assert terminal.returncode == 0 and "PASS: 0 errors" in terminal.stdout


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "no such report"),
        (b"\xff\xfe{}", "is not UTF-8 text"),
        (b"[1, 2", "is not JSON"),
        (b'{"schema": "other/1"}', "is not a dflashdoctor report"),
        (b'{"schema": "%s", "results": [{"probe": "p", "findings": [{"code": 1}]}]}' % SCHEMA.encode(), "damaged"),
        (
            b'{"schema": "%s", "results": [{"probe": "p", "plots": [{"title": "t", "unit": "bytes", "x_label": "s",'
            b' "lines": [{"label": "l", "points": [["1", "x"], [1, 2, 3]]}]}]}]}' % SCHEMA.encode(),
            "damaged",
        ),
    ],
)
def test_anything_but_a_report_is_one_line_and_exit_2(tmp_path, main_here, content, message):
    path = tmp_path / "report.json"
    if content is not None:
        path.write_bytes(content)
    shown = main_here("show", str(path))
    assert shown.returncode == 2 and shown.stdout == ""
    assert shown.stderr.startswith("dflashdoctor: ") and message in shown.stderr and shown.stderr.count("\n") == 1
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)  # reading it would block for ever
    assert "is a FIFO, not a regular file" in main_here("show", str(fifo)).stderr
    assert "is a folder" in main_here("show", str(tmp_path)).stderr
    unknown = main_here("show", str(EXAMPLES[0]), "--format", "pdf")
    assert unknown.returncode == 2 and "unknown format 'pdf'" in unknown.stderr


json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=8)),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)),
    max_leaves=12,
)


def _shaped(*keys: str) -> st.SearchStrategy[dict]:
    """A dict with the keys a report's part has, each holding any JSON value (often of the wrong type)."""
    return st.fixed_dictionaries({}, optional={key: json_values for key in keys})


finding_dicts = _shaped("code", "severity", "title", "detail", "where", "evidence", "fix")
check_dicts = _shaped("name", "status", "summary", "codes")
result_dicts = st.fixed_dictionaries(
    {"probe": json_values},
    optional={
        "status": json_values,
        "duration_s": json_values,
        "findings": st.lists(finding_dicts, max_size=2),
        "checks": st.lists(check_dicts, max_size=2),
        "measurements": json_values,
        "comparisons": json_values,
        "tables": json_values,
        "plots": json_values,
    },
)
report_fields = st.fixed_dictionaries(
    {"schema": st.just(SCHEMA)},
    optional={
        **{key: json_values for key in ("command", "argv", "started", "duration_s", "verdict", "environment", "extra")},
        "results": st.one_of(json_values, st.lists(result_dicts, max_size=2)),
    },
)


FUZZ = settings(
    max_examples=300, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@FUZZ
@given(data=report_fields, format_name=st.sampled_from(["terminal", *FILES.values()]))
def test_a_document_under_the_schema_renders_or_is_bad_input(tmp_path, data, format_name):
    """Whatever the fields hold, `show` prints the report or refuses it as bad input: never another
    exception (which the CLI would turn into an internal error, exit 3)."""
    path = tmp_path / "report.json"
    path.write_text(json.dumps(data))
    try:
        shown = show(path, format_name, verbose=True)
    except BadInput as exc:  # names the file; the CLI prints it as one line (below)
        assert str(exc).startswith(str(path))
    else:
        assert isinstance(shown, str)


@FUZZ
@given(message=st.text())
def test_bad_input_is_printed_as_one_line_whatever_it_quotes(message):
    """A message may quote a document's keys or a file's name: newlines, escape sequences, lone
    surrogates. The CLI prints it as one line of text."""
    line = cli._one_line(message)
    assert "\n" not in line and not any((ord(c) < 32 and c != "\t") or 127 <= ord(c) < 160 for c in line)
    line.encode("utf-8")


def test_a_key_with_a_newline_and_an_escape_sequence_stays_one_line(tmp_path):
    path = tmp_path / "report.json"
    path.write_text(json.dumps({"schema": SCHEMA, "results": [{"probe": "p", "\n\x1b[31m": 1}]}))
    shown = _show(str(path), cwd=tmp_path)
    assert shown.returncode == 2 and shown.stderr.count("\n") == 1 and "\x1b" not in shown.stderr
    assert "unexpected keyword argument '\\n\\x1b[31m'" in shown.stderr


_WITH_EVERYTHING = ROOT / "reports" / "examples" / "h200-run-grows-until-oom" / "report.json"  # tables, plots, bars
_EVIDENCE = ("results", 1, "findings", 0, "evidence", "hostile")  # a key of a finding's evidence, 7 levels down
# (where in the report, the bare JSON token written there, the exit code: 0 rendered, 2 refused, None either)
HOSTILE = {
    "evidence nested 900 deep": (_EVIDENCE, "[" * 900 + "]" * 900, 2),
    "measurements nested 900 deep": (("results", 0, "measurements"), '{"a":' * 900 + "1" + "}" * 900, 2),
    "a 400-digit integer in evidence": (_EVIDENCE, "9" * 400, 0),
    "1e400 in evidence": (_EVIDENCE, "1e400", 0),
    "NaN in evidence": (_EVIDENCE, "NaN", 0),
    "-Infinity in measurements": (("results", 1, "measurements", "peak_bytes"), "-Infinity", 0),
    "a 400-digit duration": (("results", 1, "duration_s"), "9" * 400, None),
    "a line of 1e400": (("results", 1, "findings", 0, "where", "line"), "1e400", None),
    "a line of NaN": (("results", 1, "findings", 0, "where", "line"), "NaN", None),
    "a bar of 1e400": (("results", 1, "comparisons", 0, "bars", 0, "value"), "1e400", None),
    "a table title of NaN": (("results", 1, "tables", 0, "title"), "NaN", None),
    "a column of 10**400": (("results", 1, "tables", 0, "columns", 0), "1" + "0" * 400, None),
}


def _written(tmp_path: Path, place: tuple, token: str) -> Path:
    """The committed report with `token` written, as a bare JSON token, at `place`."""
    document = json.loads(_WITH_EVERYTHING.read_text(encoding="utf-8"))
    holder = document
    for key in place[:-1]:
        holder = holder[key]
    holder[place[-1]] = "@HOSTILE@"
    path = tmp_path / "report.json"
    path.write_text(json.dumps(document).replace('"@HOSTILE@"', token), encoding="utf-8")
    return path


@pytest.mark.parametrize("format_name", ["terminal", *FILES.values()])
@pytest.mark.parametrize(("place", "token", "code"), HOSTILE.values(), ids=HOSTILE)
def test_a_hostile_number_or_nesting_renders_or_is_one_line_never_exit_3(
    tmp_path, main_here, place, token, code, format_name
):
    """Nesting 900 deep, which json reads, ran out of Python's recursion in every format
    (RecursionError); a duration of 10**400 in JUnit, a line of 1e400 in SARIF (OverflowError) and a
    table title or column that is not text on the terminal (rich's NotRenderableError) were internal
    errors, exit 3. A report nests 11 deep and holds finite numbers: such a document is one line of
    bad input, exit 2; a number that only sits in evidence or measurements is rendered."""
    shown = main_here("show", str(_written(tmp_path, place, token)), "--format", format_name)
    assert shown.returncode in ((0, 2) if code is None else (code,)), shown.stderr[-2000:]
    if shown.returncode == 2:
        assert shown.stdout == "" and shown.stderr.count("\n") == 1 and shown.stderr.startswith("dflashdoctor: ")
        assert "internal error" not in shown.stderr
    else:
        assert shown.stderr == "" and shown.stdout


def test_nesting_past_the_bound_is_refused_and_up_to_it_rendered(tmp_path):
    """In a real child process, where running out of stack would end the interpreter: the bound is
    100 levels (a report nests 11); evidence at exactly 100 still renders, in every format."""
    deepest = _written(tmp_path, _EVIDENCE, "[" * 94 + "]" * 94)
    for format_name in ["terminal", *FILES.values()]:
        assert _show(str(deepest), "--format", format_name, cwd=tmp_path).returncode == 0, format_name
    refused = _show(str(_written(tmp_path, _EVIDENCE, "[" * 95 + "]" * 95)), cwd=tmp_path)
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1
    assert "nests deeper than 100 levels: not a report dflashdoctor wrote" in refused.stderr
