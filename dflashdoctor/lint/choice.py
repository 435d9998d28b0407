"""Which documented command is the team's training run, and which compiled wrapper it calls: the
choices `init` writes, each with its evidence and how sure it is.

A command is scored on what a maintainer would look at: what it launches (a program named for
training: train, pretrain, finetune, sft, fit), where that program lives (never a test, a benchmark,
an example, an experiment, `old/`, `legacy/`, `records/` or vendored code when anything else is
there), where the command is written (the README first, then the repository's scripts, a Makefile,
CI), whether its program and its config file exist in the repository. An entry point no document
launches (`if __name__ == "__main__":` that steps an optimizer) is the last resort, with its
required arguments left for the user to fill.

A wrapper is ranked by where it is made (defined at module or class level before a function's
re-compile of it, both before one made per instance) and whether the training program reaches it
(its file is the program, or the program's source imports the wrapper's module); a test's, a
benchmark's, an example's or an old record's is never the target."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import PurePosixPath

from dflashdoctor.lint.launches import Launch
from dflashdoctor.lint.setup_facts import Place, SetupFacts

_TRAINING = re.compile(r"(^|[^a-z])(train|training|pretrain|finetune|fine_tune|sft|fit|distill)", re.IGNORECASE)
_TESTS = {"test", "tests", "testing", "pytest", "unittest", "conftest"}
_ASIDE = {
    "benchmark", "benchmarks", "bench", "examples", "example", "experiments", "experimental", "old",
    "legacy", "vendor", "vendored", "third_party", "thirdparty", "external", "records", "archive",
    "deprecated", "scratch", "sandbox", "docs", "notebooks", "tools", "dev", "playground",
}  # fmt: skip
_CONFIG_ARG = re.compile(r"config|\.ya?ml$|\.toml$|\.json$", re.IGNORECASE)


@dataclass
class Choice:
    """A chosen value with its evidence ("file:line", ...) and how sure init is."""

    sure: str  # "documented" (the README's), "likely" (a script's)
    why: str


def _entry_path(launch: Launch) -> str:
    """The entry as a path in the repository: `-m pkg.train` is pkg/train.py."""
    if launch.entry.startswith("-m "):
        return launch.entry[3:].replace(".", "/") + ".py"
    return launch.entry.removeprefix("./")


def place_penalty(path: str) -> int:
    """How far a file is from a team's training code: a test's is out, a benchmark's or an example's
    far, nothing else."""
    parts = {part.lower() for part in PurePosixPath(path).parts}
    stem = PurePosixPath(path).stem.lower()
    if parts & _TESTS or stem.startswith("test_") or stem.endswith("_test"):
        return 100
    if parts & _ASIDE or stem.startswith(("bench", "benchmark", "example", "demo", "debug")):
        return 6
    return 0


def _exists(facts: SetupFacts, path: str, files: set[str]) -> bool:
    if path in files or path in facts.documents:
        return True
    package = path.removesuffix(".py") + "/__main__.py"
    return package in files


def _named_file(word: str, files: set[str]) -> bool:
    """A console script's word that names a file of the repository (`tune run full_finetune` and
    recipes/full_finetune.py; `--config llama3_1/8B_full` and recipes/configs/llama3_1/8B_full.yaml)."""
    word = word.split("=", 1)[-1].removeprefix("./")
    if not word or word.startswith("-"):
        return False
    endings = (word, *(f"{word}{suffix}" for suffix in (".py", ".yaml", ".yml", ".toml", ".json")))
    return any(f == e or f.endswith("/" + e) for f in files for e in endings)


def score(launch: Launch, facts: SetupFacts, files: set[str]) -> int:
    """Higher is the training run."""
    points = 0
    console = not launch.entry.startswith("-m ") and not launch.entry.endswith(".py")
    path = _entry_path(launch)
    if _TRAINING.search(launch.entry) or any(_TRAINING.search(a) for a in launch.args[:2] if not a.startswith("-")):
        points += 4
    points -= place_penalty(path) if not console else 0
    origin = (launch.via or [f"{launch.file}:{launch.line}"])[0]
    if origin.lower().startswith("readme"):
        points += 3
    elif launch.file.lower().endswith((".sh", ".slurm", ".sbatch")):
        points += 2 if launch.file.count("/") <= 1 else 1
    elif launch.file.startswith(".github/"):
        points -= 1
    if console:
        words = launch.entry.split()
        points += 2 if len(words) > 2 and _named_file(words[-1], files) else 0  # `tune run RECIPE`: RECIPE.py
    else:
        points += 2 if _exists(facts, path, files) else -4
    values = [a for a in launch.args if not a.startswith("-") or "=" in a]
    if any(_CONFIG_ARG.search(a) for a in launch.args):
        points += 1
        points += any(_named_file(a, files) for a in values)
    if launch.launcher in ("torchrun", "accelerate", "deepspeed") or any(
        w.startswith(("--nproc", "--nnodes")) for w in launch.words
    ):
        points += 1
    if any("$" in word for word in launch.words):
        points -= 2  # a variable nothing sets: the line is not runnable as written
    return points


def choose_run(facts: SetupFacts, launches: list[Launch], files: set[str]) -> tuple[Launch | None, Choice | None]:
    """The best-scored documented command, if any scores as training."""
    if not launches:
        return None, None
    ranked = [launch for _, launch in sorted(enumerate(launches), key=lambda it: (-score(it[1], facts, files), it[0]))]
    # a runnable one first: a line with a variable nothing sets can only be written as a comment
    runnable = [launch for launch in ranked if not any("$" in word for word in launch.words)]
    best = next((launch for launch in runnable if score(launch, facts, files) >= 1), ranked[0])
    if score(best, facts, files) < 1:
        return None, None
    where = ", then ".join([*best.via, f"{best.file}:{best.line}"])
    sure = "documented" if (best.via or [best.file])[0].lower().startswith("readme") else "likely"
    return best, Choice(sure, f"{where}: {best.launcher} launches {best.entry}")


def choose_trainer(facts: SetupFacts) -> Place | None:
    """The entry point that steps an optimizer, when no document launches one: the team's own,
    named for training, shallowest."""
    candidates = [t for t in facts.trainers if place_penalty(t.file) < 100]
    if not candidates:
        return None
    return min(
        candidates,
        key=lambda t: (
            place_penalty(t.file),
            not _TRAINING.search(PurePosixPath(t.file).stem),
            t.file.count("/"),
            t.file,
        ),
    )


def _module_of(path: str) -> str:
    return path.removesuffix(".py").removesuffix("/__init__").replace("/", ".")


def _reaches(entry_source: bytes, wrapper_file: str) -> bool:
    """The program's source imports the wrapper's module (or a package above it)."""
    module = _module_of(wrapper_file)
    parts = module.split(".")
    names = {".".join(parts[:i]) for i in range(2, len(parts) + 1)} | {parts[-1]}
    return any(re.search(rb"\b(?:from|import)\s+" + re.escape(n.encode()) + rb"\b", entry_source) for n in names)


def choose_target(facts: SetupFacts, entry_file: str | None) -> tuple[Place | None, str]:
    """The compiled wrapper the training program calls, ranked: defined at module or class level
    (not a function's re-compile of it, not made per instance), in the program itself, imported by
    it, shallowest; a test's, a benchmark's, an example's or an old record's never (they are listed
    as comments)."""
    candidates = [w for w in facts.wrappers if place_penalty(w.file) == 0]
    if not candidates:
        return None, ""
    entry_source = facts.sources.get(entry_file or "", b"")

    def rank(wrapper: Place) -> tuple[int, int, int, str]:
        reached = 0 if wrapper.file == entry_file else 1 if entry_source and _reaches(entry_source, wrapper.file) else 2
        # where the wrapper is defined (module or class level) before a function's re-compile of it,
        # and both before one made per instance
        made = (wrapper.what in facts.recompiled) + 2 * (wrapper.what in facts.instance_wrappers)
        return (made, reached, wrapper.file.count("/"), wrapper.what)

    best = min(candidates, key=rank)
    reached = rank(best)[1]
    return best, {0: "in the training program itself", 1: "imported by the training program", 2: "in the package"}[
        reached
    ]
