"""The probed side imports nothing of the doctor side: the lists on the architecture page (its
`text probed-side...` blocks, a path a line), checked by importing every probed-side module in a
fresh interpreter. A doctor-side module pulled in there
(cache repair, process supervision, renderers, the CLI) would load into every process of a user's
`run` and every `expect_fused` test, and would have to exist in a `--python` that has only torch."""

from __future__ import annotations

import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import dflashdoctor

ROOT = Path(dflashdoctor.__file__).parent
ARCHITECTURE = ROOT.parent / "docs" / "architecture.md"
DOCTOR_ONLY_PACKAGES = ("typer", "rich", "click")


def _listed(name: str) -> list[str]:
    """The paths of the architecture page's `text NAME` block, one a line."""
    text = ARCHITECTURE.read_text(encoding="utf-8")
    block = re.search(rf"^```text {re.escape(name)}\n(.*?)^```$", text, re.MULTILINE | re.DOTALL)
    assert block is not None, f"docs/architecture.md has no `text {name}` block"
    return block.group(1).split()


def _modules(names: list[str], taken_out: list[str] | None = None) -> set[str]:
    """`hooks/` is the package and every module in it; `forkserver/server.py` one module."""
    taken_out = taken_out or []
    return _expanded([n for n in names if n not in taken_out]) - _expanded(taken_out)


def _expanded(names: list[str]) -> set[str]:
    modules = set()
    for name in names:
        if name == "probes/":
            folder = ROOT.parent / "probes"
            modules |= {"probes"} | {f"probes.{m.name}" for m in pkgutil.iter_modules([str(folder)])}
        elif name.startswith("probes/"):
            modules.add(name.removesuffix(".py").replace("/", "."))
        elif name.endswith("/"):
            package = "dflashdoctor." + name.rstrip("/").replace("/", ".")
            folder = ROOT / name.rstrip("/")
            modules |= {package} | {m.name for m in pkgutil.walk_packages([str(folder)], package + ".")}
        else:
            modules.add("dflashdoctor." + name.removesuffix(".py").replace("/", "."))
    return modules


def test_the_probed_side_loads_only_itself_and_the_judges():
    probed = _modules(_listed("probed-side"), _listed("probed-side-but-not"))
    judges = _modules(_listed("probed-side-judges"))
    assert {"dflashdoctor.hooks.flex_dense", "dflashdoctor.observations", "dflashdoctor.testing"} <= probed
    assert "probes.check_compile" in probed and "probes.run_smoke" not in probed
    assert "dflashdoctor.judges.base" in judges
    code = (
        "import importlib, sys\n"
        f"for name in {sorted(probed)!r}:\n"
        "    importlib.import_module(name)\n"
        "print('\\n'.join(sorted(sys.modules)))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT.parent, timeout=600, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    loaded = set(done.stdout.split())
    # the packages above a listed module load with it (what their __init__ imports would show here)
    parents = {m.rsplit(".", 1)[0] for m in probed | judges if "." in m}
    ours = {m for m in loaded if m.startswith("dflashdoctor.")} - parents
    assert sorted(ours - probed - judges) == [], " ".join(sorted(ours - probed - judges))
    assert sorted(m for m in loaded if m.split(".")[0] in DOCTOR_ONLY_PACKAGES) == []
