"""`dflashdoctor lint` as a linter in a team's pre-commit and CI: `# noqa`, the
`[tool.dflashdoctor.lint]` table and the command line's --select/--ignore/--exclude, .gitignore and
virtual environments skipped, each output format (stdout parsed as JSON, GitHub annotations, SARIF),
exit codes as ruff's, no report folder unless asked, the pre-commit hook's own entry on a list of
files, and the configuration another local user could have placed. In this process (run_main_here):
lint imports nothing of the files it reads."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import as_nobody, run_main_here
from tests.paths import ROOT

_FLEX = "import torch\nfrom torch.nn.attention.flex_attention import flex_attention\n"
RAW = _FLEX + "\n\ndef attend(q):\n    return flex_attention(q, q, q)\n"  # line 6
EAGER = _FLEX + "wrapper = torch.compile(flex_attention, backend='eager')\n"  # line 3


def _lint(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_main_here(folder, ["lint", *args])


def _repo(tmp_path: Path, files: dict[str, str]) -> Path:
    repo = tmp_path / "repo"
    for name, text in files.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(text)
    (repo / "pyproject.toml").write_text((repo / "pyproject.toml").read_text() if "pyproject.toml" in files else "")
    return repo


def test_one_line_a_finding_exit_1_and_no_report_folder(tmp_path):
    repo = _repo(tmp_path, {"attn.py": RAW, "wrap.py": EAGER})
    done = _lint(repo)
    assert done.returncode == 1, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("attn.py:6:12: DFD001 flex_attention is called raw")
    assert lines[1].startswith("wrap.py:3:1: DFD002 flex_attention is compiled with backend='eager'")
    assert lines[2] == "Found 2 findings (2 files read)."
    assert sorted(p.name for p in repo.iterdir()) == ["attn.py", "pyproject.toml", "wrap.py"]  # no reports/
    clean = _repo(tmp_path / "clean", {"ok.py": _FLEX + "fast = torch.compile(flex_attention)\n"})
    done = _lint(clean)
    assert done.returncode == 0 and done.stdout == "All checks passed (1 file read).\n", done.stdout


def test_noqa_bare_or_naming_the_code_silences_that_line_only(tmp_path):
    source = RAW + "\n\ndef two(q):\n    return flex_attention(q, q, q)  # noqa: E501, DFD001\n"
    source += "\n\ndef three(q):\n    return flex_attention(q, q, q)  # NOQA\n"
    source += "\n\ndef four(q):\n    return flex_attention(q, q, q)  # noqa: E501\n"
    repo = _repo(tmp_path, {"attn.py": source})
    done = _lint(repo, "--output-format", "json")
    assert [(f["code"], f["location"]["row"]) for f in json.loads(done.stdout)] == [("DFD001", 6), ("DFD001", 18)]


def test_the_table_selects_ignores_excludes_and_ignores_per_file(tmp_path):
    table = (
        "[tool.dflashdoctor.lint]\n"
        'exclude = ["third_party/", "gen_*.py"]\n'
        'per-file-ignores = { "scripts/**" = ["DFD001"] }\n'
        'ignore = ["DFD002"]\n'
    )
    files = {
        "pyproject.toml": table,
        "attn.py": RAW,
        "wrap.py": EAGER,
        "third_party/vendored.py": RAW,
        "gen_kernels.py": RAW,
        "scripts/debug/probe.py": RAW,
    }
    repo = _repo(tmp_path, files)
    done = _lint(repo, "--output-format", "json")
    assert [f["filename"] for f in json.loads(done.stdout)] == ["attn.py"], done.stdout
    # the command line over the table: --select replaces, --ignore adds
    done = _lint(repo, "--output-format", "json", "--select", "DFD002")
    assert [f["filename"] for f in json.loads(done.stdout)] == ["wrap.py"]
    done = _lint(repo, "--ignore", "DFD001")
    assert done.returncode == 0, done.stdout
    # run from a subfolder, the table is found above it
    done = _lint(repo / "scripts", "--output-format", "json", "--select", "ALL")
    assert json.loads(done.stdout) == [] and done.returncode == 0


@pytest.mark.parametrize(
    ("table", "said"),
    [
        ('select = ["DFD999"]', "unknown rule code 'DFD999'"),
        ('selekt = ["DFD001"]', "unknown key 'selekt'"),
        ("exclude = 3", "exclude in"),
        ('per-file-ignores = ["a"]', "per-file-ignores in"),
        ("select = [", "is not valid TOML"),
    ],
)
def test_a_bad_table_is_one_line_and_exit_2(tmp_path, table, said):
    repo = _repo(tmp_path, {"pyproject.toml": f"[tool.dflashdoctor.lint]\n{table}\n", "attn.py": RAW})
    done = _lint(repo)
    assert done.returncode == 2 and said in done.stderr and done.stderr.count("\n") == 1, done.stderr


def test_the_gate_reads_past_lints_own_table(tmp_path):
    """[tool.dflashdoctor.lint] sits inside the gate's table: the gate must not call it an unknown key."""
    repo = _repo(
        tmp_path,
        {"pyproject.toml": '[tool.dflashdoctor]\nprobes = ["env"]\n\n[tool.dflashdoctor.lint]\nignore = ["DFD006"]\n'},
    )
    done = run_main_here(repo, ["gate", "--report-dir", str(tmp_path / "r")])
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]


def test_gitignored_files_and_virtual_environments_are_not_read(tmp_path):
    files = {
        ".gitignore": "# build output\nout/\n*.gen.py\n!keep.gen.py\n",
        "attn.py": RAW,
        "out/copy.py": RAW,
        "a.gen.py": RAW,
        "keep.gen.py": RAW,
        "env/pyvenv.cfg": "home = /usr\n",
        "env/lib/site.py": RAW,
        "conda/conda-meta/history": "",
        "conda/pkg.py": RAW,
        "pkg/.gitignore": "local.py\n",
        "pkg/local.py": RAW,
        "pkg/mod.py": RAW,
    }
    repo = _repo(tmp_path, files)
    done = _lint(repo, "--output-format", "json")
    assert sorted(f["filename"] for f in json.loads(done.stdout)) == ["attn.py", "keep.gen.py", "pkg/mod.py"]


def test_each_output_format_is_parseable_and_says_the_place(tmp_path):
    repo = _repo(tmp_path, {"attn.py": RAW})
    found = json.loads(_lint(repo, "--output-format", "json").stdout)
    assert found == [
        {
            "code": "DFD001",
            "name": "lint-raw-flex-call",
            "severity": "error",
            "message": found[0]["message"],
            "filename": "attn.py",
            "location": {"row": 6, "column": 12},
            "function": "attend",
            "detail": found[0]["detail"],
            "fix": found[0]["fix"],
        }
    ]
    github = _lint(repo, "--output-format", "github").stdout
    assert github.startswith("::error file=attn.py,line=6,col=12,title=lint-raw-flex-call::")
    sarif = json.loads(_lint(repo, "--output-format", "sarif").stdout)
    region = sarif["runs"][0]["results"][0]["locations"][0]["physicalLocation"]["region"]
    assert region == {"startLine": 6, "startColumn": 12}
    full = _lint(repo, "--output-format", "full").stdout.splitlines()
    assert full[0].startswith("attn.py:6:12: DFD001") and full[2].startswith("    fix: ")
    report = json.loads(_lint(repo, "--json").stdout)  # the report document, as every command's --json
    assert report["results"][0]["findings"][0]["where"]["column"] == 12
    done = _lint(repo, "--output-format", "yaml")
    assert done.returncode == 2 and "--output-format must be one of" in done.stderr


def test_names_with_control_characters_and_bytes_stay_one_line(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    name = os.fsencode(repo) + b"/evil\x1b[2J\nDFD000 \xff.py"
    with open(name, "w") as handle:
        handle.write(RAW)
    done = run_main_here(repo, ["lint"], errors="surrogateescape")
    lines = done.stdout.splitlines()
    assert (
        len(lines) == 2
        and "\x1b" not in done.stdout
        and lines[0].endswith("called raw, outside any compiled region: it runs its dense kernel")
    )
    assert json.loads(_lint(repo, "--output-format", "json").stdout)[0]["location"]["row"] == 6


def test_the_pre_commit_hook_judges_the_files_it_is_given_with_their_project(tmp_path):
    """pre-commit passes the changed files only; the model compiled in the launcher still makes the
    call inside it compiled, and a changed file that rebinds the wrapper is still found."""
    hooks = yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text())
    (hook,) = hooks
    assert hook["id"] == "dflashdoctor-lint" and hook["types"] == ["python"] and hook["language"] == "python"
    model = _FLEX + "class Attn(torch.nn.Module):\n    def forward(self, q):\n        return flex_attention(q, q, q)\n"
    repo = _repo(tmp_path, {"pkg/model.py": model, "train.py": "import torch\nmodel = torch.compile(model)\n"})
    entry = hook["entry"].split()[1:]
    done = run_main_here(repo, [*entry, "pkg/model.py"])
    assert done.returncode == 0, done.stdout
    (repo / "train.py").write_text("import torch\n")
    done = run_main_here(repo, [*entry, "pkg/model.py"])
    assert done.returncode == 1 and done.stdout.startswith("pkg/model.py:5:16: DFD001"), done.stdout


def test_a_lint_table_another_user_linked_or_made_a_fifo_is_refused_never_followed(tmp_path, shared):
    if os.geteuid() != 0:
        pytest.skip("another local user's files need root to make")
    folder = shared / "team"
    folder.mkdir()
    folder.chmod(0o1777)
    (folder / "attn.py").write_text(RAW)
    as_nobody(f"ln -s /etc/shadow {folder}/pyproject.toml")
    done = _lint(folder)
    assert done.returncode == 2 and "symbolic link" in done.stderr and done.stderr.count("\n") == 1, done.stderr
    os.unlink(folder / "pyproject.toml")
    os.mkfifo(folder / "pyproject.toml")
    done = _lint(folder)
    assert done.returncode == 2 and "FIFO" in done.stderr, done.stderr


def test_lint_in_a_fresh_interpreter_prints_only_the_findings_on_stdout(tmp_path):
    """stdout parsed as JSON by a CI step: nothing else reaches it."""
    repo = _repo(tmp_path, {"attn.py": RAW})
    done = subprocess.run(
        [sys.executable, "-m", "dflashdoctor", "lint", "--output-format", "json"],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1 and done.stderr == "", done.stderr
    assert json.loads(done.stdout)[0]["code"] == "DFD001"
