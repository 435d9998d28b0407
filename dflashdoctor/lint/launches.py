"""The commands a repository documents for training, read from where teams write them: README code
blocks, shell, Slurm and sbatch scripts, Makefile recipes, CI workflow steps, and the console
scripts `[project.scripts]` names. Each command is split as a shell would, its variables filled from
the script's own assignments (`NGPU=${NGPU:-8}`, `CONFIG_FILE=...` before `./run_train.sh`), a line
that calls another script (`./run_train.sh`, `bash scripts/train.sh`, `sbatch job.slurm`) followed
into that script, and the training program it launches found: the launcher (`torchrun`,
`accelerate launch`, `deepspeed`, `python`, a project's console script such as `tune run`), the
module or script, and the arguments the program was documented with (its config file).

Nothing here runs or imports the repository; `init` ranks what is found (commands/init.py)."""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field

_PYTHON = re.compile(r"^(?:.*/)?python(?:3(?:\.\d+)?)?$")
_LAUNCHERS = {"torchrun", "deepspeed", "accelerate", "lightning", "composer"}
_SCRIPT = re.compile(r"\.(?:sh|slurm|sbatch|bash)$")
_ASSIGN = re.compile(r"^\s*(?:export\s+|local\s+|readonly\s+)?([A-Za-z_]\w*)=(.*)$")
_DEFAULT_ASSIGN = re.compile(r"^\s*:\s+\"?\$\{([A-Za-z_]\w*):?=([^}]*)\}\"?\s*$")
_VARIABLE = re.compile(r"\$\{([A-Za-z_]\w*)(?::?[-=]([^}]*))?\}|\$([A-Za-z_]\w*)")
_FENCE = re.compile(r"^\s*(```+|~~~+)\s*([\w+-]*)")
_SHELL_FENCES = {"", "bash", "sh", "shell", "console", "zsh", "text", "shell-session", "sbatch", "slurm"}


@dataclass
class Launch:
    """One documented command that starts a Python program."""

    file: str  # where it is written, relative to the repository
    line: int
    words: list[str]  # the command from its launcher on, variables filled
    launcher: str  # torchrun, python, accelerate, deepspeed, or the console script's name
    entry: str  # `-m pkg.mod`, `path/to/script.py`, or the console script's words (`tune run recipe`)
    args: list[str] = field(default_factory=list)  # what follows the entry
    via: list[str] = field(default_factory=list)  # "file:line" of the lines that led here

    def command(self) -> str:
        return shlex.join(self.words)


def _split(line: str) -> list[str] | None:
    try:
        return shlex.split(line, comments=True)
    except ValueError:
        return None


_VALUE_CHARS = 4096  # a longer value is not a path or a number: the variable is left unset


def _filled(text: str, variables: dict[str, str]) -> str:
    """`$NAME`, `${NAME}`, `${NAME:-default}` replaced by what the script set, else the default;
    one that is neither stays as written (the command is then not runnable as is, and says so).
    What comes out is capped: `A=$B$B` forty deep in a hostile script would double forty times."""

    def value(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(3)
        if name in variables:
            return variables[name]
        if match.group(2) is not None:
            return match.group(2).strip("\"'")
        return match.group(0)

    filled = _VARIABLE.sub(value, text)
    return filled if len(filled) <= _VALUE_CHARS else text


def _logical_lines(text: str) -> list[tuple[int, str]]:
    """Lines with their `\\` continuations joined, each with the number of its first line."""
    joined: list[tuple[int, str]] = []
    pending, start = "", 0
    for number, line in enumerate(text.splitlines(), 1):
        if not pending:
            start = number
        stripped = line.rstrip()
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        joined.append((start, pending + line))
        pending = ""
    if pending:
        joined.append((start, pending))
    return joined


def _is_head(word: str, scripts: dict[str, str]) -> bool:
    return bool(_PYTHON.match(word)) or word in _LAUNCHERS or word in scripts or word == "tune"


def _program(words: list[str], scripts: dict[str, str]) -> tuple[str, str, list[str], int] | None:
    """(launcher, entry, args, where the launcher starts) of a command, or None when it starts no
    Python program. What comes before the launcher (env prefixes, `srun -N 2`, `uv run`) is passed
    over: the launcher is the first word that names one."""
    i = next((i for i, word in enumerate(words) if _is_head(word, scripts)), None)
    if i is None:
        return None
    head, rest = words[i], words[i + 1 :]
    if _PYTHON.match(head):
        if rest[:2] in (["-m", "torch.distributed.run"], ["-m", "torch.distributed.launch"]):
            return _after_options("torchrun", rest[2:], i)
        return _after_options("python", rest, i)
    if head in ("torchrun", "deepspeed", "composer"):
        return _after_options(head, rest, i)
    if head == "accelerate":
        return _after_options("accelerate", rest[1:], i) if rest[:1] == ["launch"] else None
    if head == "lightning" and rest[:1] == ["run"]:
        return _after_options("lightning", rest[2:], i)
    return _console(head, rest, i)


_VERBS = {"run", "fit", "train", "launch", "finetune"}  # a console script's verb that names a recipe after it


def _console(head: str, rest: list[str], start: int) -> tuple[str, str, list[str], int]:
    """A project's console script: its subcommand, and for a verb such as `run` the recipe it runs
    (`tune run --nproc_per_node 2 full_finetune_distributed --config X`: options between them are
    the launcher's, each read with its value)."""
    if not rest or rest[0].startswith("-"):
        return head, head, rest, start
    entry, i = [head, rest[0]], 1
    if rest[0] in _VERBS:
        while i < len(rest) and rest[i].startswith("-"):
            i += 1 if "=" in rest[i] or i + 1 >= len(rest) or rest[i + 1].startswith("-") else 2
        if i < len(rest):
            entry.append(rest[i])
            i += 1
    return head, " ".join(entry), rest[i:], start


# Launcher options that take no value (all others are read as `--name value`).
_FLAGS = {"--standalone", "-u", "-O", "-B", "--no_python", "--no-python", "--use_env", "--multi_gpu", "--cpu"}


def _after_options(launcher: str, rest: list[str], start: int) -> tuple[str, str, list[str], int] | None:
    i = 0
    while i < len(rest):
        word = rest[i]
        if word == "-m" and i + 1 < len(rest):
            return launcher, f"-m {rest[i + 1]}", rest[i + 2 :], start
        if word.endswith(".py"):
            return launcher, word, rest[i + 1 :], start
        if word.startswith("-"):
            takes_value = "=" not in word and word not in _FLAGS and launcher != "python"
            i += 1 + takes_value
            continue
        return None  # a program that is not Python (`torchrun --no-python ./bin`), or a word unknown
    return None


@dataclass
class _Reader:
    """Reads one repository's documents; `read(relative)` gives a file's text, or None."""

    read: Callable[[str], str | None]
    scripts: dict[str, str]
    found: list[Launch] = field(default_factory=list)
    depth: int = 0

    def commands(self, relative: str, lines: list[tuple[int, str]], variables: dict[str, str], via: list[str]) -> None:
        variables = dict(variables)
        for number, line in lines:
            stripped = line.strip().removeprefix("$ ").removeprefix("> ")
            if not stripped or stripped.startswith("#"):
                continue
            defaulted = _DEFAULT_ASSIGN.match(stripped)
            if defaulted:
                variables.setdefault(defaulted.group(1), _filled(defaulted.group(2), variables).strip("\"'"))
                continue
            assigned = _ASSIGN.match(stripped)
            if assigned and " " not in assigned.group(2).strip().strip("\"'"):
                words = _split(_filled(assigned.group(2), variables))
                variables[assigned.group(1)] = words[0] if words else ""
                continue
            for part in re.split(r"\s*(?:&&|\|\||;)\s*", stripped):
                self._command(relative, number, part, variables, via)

    def _command(self, relative: str, number: int, text: str, variables: dict[str, str], via: list[str]) -> None:
        words = _split(_filled(text, variables))
        if not words:
            return
        env = {}
        while words and re.match(r"^[A-Za-z_]\w*=", words[0]):
            name, _, value = words.pop(0).partition("=")
            env[name] = value
        if not words:
            return
        called = self._called_script(words)
        if called is not None:
            self._follow(called, {**variables, **env}, [*via, f"{relative}:{number}"])
            return
        program = _program(words, self.scripts)
        if program is None:
            return
        launcher, entry, args, start = program
        if "$@" in args:
            args = [a for a in args if a != "$@"]
        self.found.append(
            Launch(relative, number, [w for w in words[start:] if w != "$@"], launcher, entry, args, list(via))
        )

    @staticmethod
    def _called_script(words: list[str]) -> str | None:
        """The script a line runs: `./run_train.sh`, `bash scripts/x.sh`, `sbatch job.slurm`."""
        head = words[0]
        if head in ("bash", "sh", "sbatch", "source", ".") and len(words) > 1:
            candidates = [w for w in words[1:] if not w.startswith("-")]
            return candidates[0] if candidates and _SCRIPT.search(candidates[0]) else None
        return head if _SCRIPT.search(head) else None

    def _follow(self, script: str, variables: dict[str, str], via: list[str]) -> None:
        if self.depth >= 3:
            return
        relative = script.removeprefix("./")
        text = self.read(relative)
        if text is None:
            return
        self.depth += 1
        try:
            self.commands(relative, _logical_lines(text), variables, via)
        finally:
            self.depth -= 1


def project_scripts(pyproject_text: str) -> dict[str, str]:
    """`[project.scripts]`: console script name -> `module:function`."""
    import tomllib

    try:
        data = tomllib.loads(pyproject_text)
    except (tomllib.TOMLDecodeError, RecursionError, ValueError):
        return {}
    scripts = data.get("project", {}).get("scripts", {}) if isinstance(data.get("project"), dict) else {}
    return (
        {k: v for k, v in scripts.items() if isinstance(k, str) and isinstance(v, str)}
        if isinstance(scripts, dict)
        else {}
    )


def _markdown_blocks(text: str) -> list[tuple[int, str]]:
    """The lines of a Markdown file's shell code blocks (fenced with a shell language, or none)."""
    lines: list[tuple[int, str]] = []
    fence: str | None = None
    shell = False
    for number, line in enumerate(text.splitlines(), 1):
        match = _FENCE.match(line)
        if fence is None and match:
            fence, shell = match.group(1), match.group(2).lower() in _SHELL_FENCES
            continue
        if fence is not None and line.strip().startswith(fence[:3]):
            fence = None
            continue
        if fence is not None and shell:
            lines.append((number, line))
    return _logical_lines_numbered(lines)


def _logical_lines_numbered(lines: list[tuple[int, str]]) -> list[tuple[int, str]]:
    joined: list[tuple[int, str]] = []
    pending, start = "", 0
    for number, line in lines:
        if not pending:
            start = number
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        joined.append((start, pending + line))
        pending = ""
    return joined


def _makefile_recipes(text: str) -> list[tuple[int, str]]:
    return [(n, line.lstrip("\t@-")) for n, line in _logical_lines(text) if line.startswith("\t")]


def _workflow_runs(text: str) -> list[tuple[int, str]]:
    """The shell lines of a workflow's `run:` steps (one line, or a `|` block)."""
    found: list[tuple[int, str]] = []
    block_indent: int | None = None
    for number, line in enumerate(text.splitlines(), 1):
        indent = len(line) - len(line.lstrip())
        if block_indent is not None:
            if line.strip() and indent <= block_indent:
                block_indent = None
            else:
                found.append((number, line))
                continue
        match = re.match(r"^\s*-?\s*run:\s*(.*)$", line)
        if match:
            value = match.group(1).strip()
            if value in ("|", ">", "|-", ">-", ""):
                block_indent = indent
            else:
                found.append((number, value.strip("\"'")))
    return _logical_lines_numbered(found)


DOCUMENT_KINDS: dict[str, Callable[[str], list[tuple[int, str]]]] = {
    "markdown": _markdown_blocks,
    "shell": _logical_lines,
    "makefile": _makefile_recipes,
    "workflow": _workflow_runs,
}


def document_kind(relative: str) -> str | None:
    """Which documents are read for commands, by their path."""
    name = relative.rsplit("/", 1)[-1]
    lower = name.lower()
    if lower.endswith((".md", ".rst")) and (lower.startswith("readme") or "/" not in relative or "train" in lower):
        return "markdown"
    if _SCRIPT.search(lower):
        return "shell"
    if name in ("Makefile", "makefile", "GNUmakefile"):
        return "makefile"
    if relative.startswith(".github/workflows/") and lower.endswith((".yml", ".yaml")):
        return "workflow"
    return None


def launches(documents: dict[str, str], scripts: dict[str, str]) -> list[Launch]:
    """Every Python program the documents launch, in their order (README first)."""
    reader = _Reader(read=documents.get, scripts=scripts)
    order = sorted(documents, key=lambda r: (document_kind(r) != "markdown", r.count("/"), r))
    for relative in order:
        kind = document_kind(relative)
        if kind is not None:
            reader.commands(relative, DOCUMENT_KINDS[kind](documents[relative]), {}, [])
    return reader.found
