"""What the files lint reads say about each other. A flex_attention call is compiled by what another
file does as often as by its own: a launcher that compiles the model whose forward reaches it
(`model = torch.compile(model)`, `block.compile()`), a trainer that hands its function to
`torch.compile(fn)`, a test that rebinds a wrapper class's attribute. So lint first reads what every
file compiles and which wrappers it makes (facts.CompileSites, FileFacts.compiles), then judges each
file against all of it.

A file named on the command line (a pre-commit hook passes only the files that changed) is judged
against its project: the nearest folder above it that holds pyproject.toml, setup.py, setup.cfg or
.git, read for what it compiles."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from dflashdoctor.lint.facts import FileFacts

# What a file must hold for it to compile anything lint follows (`re.compile(` is not one).
_COMPILE_HINT = re.compile(rb"torch\.compile\(|(?<!\bre)(?<!regex)\.compile\(|aot_compile|export\.export\(")


def compiles_something(data: bytes) -> bool:
    """Whether a file may compile a function or a model. Substring tests first (C speed): the regex
    alone, over every file of transformers, cost 1.2 s of lint's time; after them, 0.06 s."""
    if b"compile(" not in data and b"aot_compile" not in data and b"export.export(" not in data:
        return False
    return _COMPILE_HINT.search(data) is not None


_PROJECT_MARKERS = ("pyproject.toml", "setup.py", "setup.cfg", ".git")
_PROJECT_DEPTH = 12  # folders looked through above a file for its project


@dataclass
class Project:
    """The compile sites and wrappers of every file read, each with the file and line it came from."""

    functions: dict[str, str] = field(default_factory=dict)  # a compiled function's name -> "file:line"
    models: list[str] = field(default_factory=list)  # "file:line" of each model compiled whole
    wrappers: dict[str, str] = field(default_factory=dict)  # "Class.attr" or name -> "file:line"
    defined: set[str] = field(default_factory=set)  # wrappers bound at module or class level
    decorators: set[str] = field(default_factory=set)  # the project's own compile decorators
    decorated: list[tuple[str, str, str]] = field(default_factory=list)  # (function, decorator, "file:line")

    def add(self, facts: FileFacts) -> None:
        sites = facts.compile_sites
        for name, line in sites.functions.items():
            self.functions.setdefault(name, f"{facts.path}:{line}")
        self.models += [f"{facts.path}:{line}" for line in sites.models]
        self.decorators |= sites.decorators
        self.decorated += [(name, decorator, f"{facts.path}:{line}") for line, name, decorator in sites.decorated]
        for call in facts.compiles:
            if call.compiles_flex:
                for text in call.bound_to:
                    if call.in_function:  # a function's re-compile: named only where no definition is
                        self.wrappers.setdefault(text, f"{facts.path}:{call.line}")
                    elif text not in self.defined:
                        self.wrappers[text] = f"{facts.path}:{call.line}"
                        self.defined.add(text)

    def compiled_function(self, name: str) -> str | None:
        """Where a function of this name is compiled: handed to torch.compile, or decorated with one
        of the project's own compile decorators (`@conditional_torch_compile`)."""
        if name in self.functions:
            return f"torch.compile({name}) at {self.functions[name]}"
        found = next(((d, s) for f, d, s in self.decorated if f == name and d in self.decorators), None)
        return f"@{found[0]} at {found[1]}" if found else None

    def model_compiled(self) -> str | None:
        """Where a model is compiled whole: torch.compile(model), block.compile(), or a forward
        decorated with the project's compile decorator."""
        if self.models:
            return self.models[0]
        return next((s for f, d, s in self.decorated if f == "forward" and d in self.decorators), None)

    @classmethod
    def of(cls, *files: FileFacts) -> Project:
        project = cls()
        for facts in files:
            project.add(facts)
        return project


def marked_root(path: Path) -> Path | None:
    """The nearest folder above `path` that marks a project (pyproject.toml, setup.py, setup.cfg,
    .git), if any within a few levels."""
    folder = path.resolve().parent
    for candidate in [folder, *folder.parents][:_PROJECT_DEPTH]:
        if any(os.path.lexists(candidate / marker) for marker in _PROJECT_MARKERS):
            return candidate
    return None


def project_root(path: Path) -> Path:
    """The folder paths below it are named from: the project's, else the file's own."""
    return marked_root(path) or path.resolve().parent
