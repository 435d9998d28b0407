"""init and lint scored against copies of real repositories (tests/realworld/repos/NAME, a few files
each at their original paths, `# copied from owner/repo@sha: path` at the top) and the truth read
from their code by hand (NAME.truth.toml: the run command, the wrapper, threads, and every
flex_attention call with its kind and file:line evidence). The tests (test_repo_corpus.py) and the
benchmark (benchmarks/repo_corpus.py) both score with this; the held-out copies
(tests/realworld/held_out_repos) are scored the same way, once."""

from __future__ import annotations

import os
import shlex
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dflashdoctor.commands.init import InitOptions, init
from dflashdoctor.commands.lint import LintOptions, lint
from dflashdoctor.lint import sources
from dflashdoctor.lint.facts import FileFacts, file_facts
from dflashdoctor.lint.project import Project
from dflashdoctor.lint.rules import call_kind
from dflashdoctor.lint.settings import LintSettings
from dflashdoctor.lint.walk import lint_files

HERE = Path(__file__).parent
CORPUS = HERE / "repos"
HELD_OUT = HERE / "held_out_repos"


def cases(folder: Path = CORPUS) -> list[str]:
    return sorted(p.name.removesuffix(".truth.toml") for p in folder.glob("*.truth.toml"))


def truth(name: str, folder: Path = CORPUS) -> dict[str, Any]:
    return tomllib.loads((folder / f"{name}.truth.toml").read_text())


@dataclass
class Score:
    """Each field right or wrong, with what init or lint said against the truth."""

    name: str
    fields: dict[str, bool] = field(default_factory=dict)
    said: dict[str, str] = field(default_factory=dict)
    calls: dict[str, int] = field(default_factory=dict)  # "right", "false positive", "missed risk", "other"
    wrong_calls: list[str] = field(default_factory=list)


def _normalized(words: list[str]) -> list[str]:
    return [w.removeprefix("./") for w in words]


def run_right(command: str | None, expected: dict[str, Any]) -> bool:
    """The command init wrote is the documented training run: one of the accepted commands, or the
    same launcher and entry keeping every required argument."""
    if command is None:
        return not expected.get("entry")
    if not expected.get("entry") and not expected.get("acceptable_entries"):
        return False  # nothing trains here: any command is wrong
    words = _normalized(shlex.split(command))
    accepted = [_normalized(shlex.split(c)) for c in expected.get("acceptable_commands", [])]
    if words in accepted:
        return True
    launcher = expected.get("launcher") or ""
    launched = {"python": ("python", "python3"), "accelerate": ("accelerate",)}.get(launcher, (launcher,))
    if launcher and not any(
        w.rsplit("/", 1)[-1] in launched or (w.rsplit("/", 1)[-1].startswith("python") and launcher == "python")
        for w in words[:3]
    ):
        return False
    entries = [expected.get("entry", ""), *expected.get("acceptable_entries", [])]
    if not any(_holds(words, _normalized(entry.split())) for entry in entries if entry):
        return False
    text = " ".join(words)
    arg_sets = [expected.get("required_args", []), *expected.get("acceptable_required_args", [])]
    return any(all(arg.removeprefix("./") in text for arg in args) for args in arg_sets)


def _holds(words: list[str], part: list[str]) -> bool:
    """The entry's words in the command, in order (a launcher's options may stand between them:
    `tune run --nproc_per_node 2 full_finetune_distributed`)."""
    remaining = iter(words)
    return all(any(word == wanted for word in remaining) for wanted in part)


def _config(repo: Path) -> dict[str, Any]:
    return tomllib.loads(init(InitOptions(root=repo)))["tool"]["dflashdoctor"]


def _project(repo: Path) -> list[FileFacts]:
    facts = []
    for path, relative in lint_files([repo], LintSettings(), repo):
        try:
            found = file_facts(relative, sources.read_source(path))
        except (OSError, SyntaxError, ValueError, RecursionError):
            continue
        found.relative = relative
        facts.append(found)
    return facts


def call_kinds(repo: Path) -> dict[tuple[str, int], str]:
    """(file, line) -> the kind lint gives each raw flex_attention call in the copy."""
    facts = _project(repo)
    project = Project.of(*facts)
    return {(f.path, c.line): call_kind(c, f, project).kind for f in facts for c in f.raw_calls}


def score(name: str, folder: Path = CORPUS) -> Score:
    expected = truth(name, folder)
    repo = folder / name
    result = Score(name)
    config = _config(repo)
    init_truth = expected.get("init", {})
    run = config.get("run")
    result.said["run"] = str(run)
    result.fields["run"] = run_right(run, init_truth.get("run", {}))
    target = config.get("target", "")
    wanted = init_truth.get("target", {})
    result.said["target"] = target
    result.fields["target"] = target == wanted.get("wrapper", "") or target in wanted.get("acceptable", [])
    threads = config.get("threaded_autotuners")
    result.said["threaded_autotuners"] = str(threads)
    result.fields["threaded_autotuners"] = threads == init_truth.get("threads", {}).get("threaded_autotuners")
    kinds = call_kinds(repo)
    for call in expected.get("flex_calls", []):
        ours = kinds.get((call["file"], call["line"]), "compiled")  # a wrapper's call: compiled
        if ours == call["kind"]:
            outcome = "right"
        elif ours == "risk":
            outcome = "false positive"
        elif call["kind"] == "risk":
            outcome = "missed risk"
        else:
            outcome = "other"
        result.calls[outcome] = result.calls.get(outcome, 0) + 1
        if outcome != "right":
            result.wrong_calls.append(f"{call['file']}:{call['line']}: truth {call['kind']}, lint {ours}")
    found = {(file, line) for _code, file, line, severity in lint_findings(repo) if severity != "info"}
    found |= {(file, line) for file, line in _alias_lines(repo)}  # a raw call through an alias names it
    for other in expected.get("lint_other", []):
        flagged = (other["file"], other["line"]) in found
        right = flagged == (other["kind"] == "risk")
        outcome = "right" if right else "missed risk" if other["kind"] == "risk" else "false positive"
        result.calls[outcome] = result.calls.get(outcome, 0) + 1
        if not right:
            result.wrong_calls.append(f"{other['file']}:{other['line']}: truth {other['kind']}, lint flagged={flagged}")
    return result


def _alias_lines(repo: Path) -> list[tuple[str, int]]:
    facts = _project(repo)
    project = Project.of(*facts)
    return [
        (f.path, c.alias_line)
        for f in facts
        for c in f.raw_calls
        if c.alias_line and call_kind(c, f, project).kind == "risk"
    ]


def lint_findings(repo: Path) -> list[tuple[str, str, int, str]]:
    """(code, file, line, severity) of what `lint` reports on the copy by default."""
    cwd = os.getcwd()
    os.chdir(repo)
    try:
        report = lint(LintOptions(paths=[Path(".")]), ["lint"])
    finally:
        os.chdir(cwd)
    return [(f.code, f.where.file or "", f.where.line or 0, f.severity) for f in report.results[0].findings if f.where]
