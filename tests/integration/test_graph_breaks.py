"""Graph breaks as the CLI reports them, on real compiled code: each names the line, dynamo's reason
and its fix, with counts checked against dynamo's own account taken in a separate process
(tests/targets/graph_breaks.py --truth: dynamo's graph_break counter and torch._dynamo.explain)."""

from __future__ import annotations

import json
import logging
import subprocess
import sys

import pytest
import torch

from dflashdoctor.hooks.dynamo_watch import DynamoWatch
from dflashdoctor.judges.graph_breaks import HF_MASK_FLAG
from tests.paths import TARGETS

SCRIPT = TARGETS / "graph_breaks.py"


def _truth(*args: str) -> dict[str, int]:
    """What dynamo itself counted for the target, in a process dflashdoctor never touched."""
    done = subprocess.run(
        [sys.executable, str(SCRIPT), *args, "--truth"], capture_output=True, text=True, timeout=600, check=True
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def _line(marker: str) -> int:
    lines = SCRIPT.read_text(encoding="utf-8").splitlines()
    return next(number for number, text in enumerate(lines, 1) if marker in text)


def _breaks(run) -> int:
    return run.report["results"][0]["measurements"]["graph_breaks"]


def test_an_hf_model_compiled_whole_names_transformers_line_and_the_hazard_fix(cli_here):
    run = cli_here("trace-attention", "--script", str(SCRIPT), "--", "hf")
    assert run.code == 0, run.stdout + run.stderr
    (found,) = run.findings("graph-break")
    assert found["where"]["file"].replace("\\", "/").endswith("transformers/masking_utils.py")
    assert found["where"]["function"] == "flex_attention_mask"
    assert found["evidence"]["known_cause"] == HF_MASK_FLAG and "_warnings.warn" in found["evidence"]["reason"]
    assert "ignore_logging_functions.add(warnings.warn)" in found["fix"]
    assert found["evidence"]["breaks"] == _breaks(run) == _truth("hf")["counter"] == 8
    assert "TORCH_LOGS" not in run.stdout + run.stderr  # watching logs nothing, and the report needs no logs


@pytest.mark.parametrize("fix", ["--ignore-warn", "--layers"])
def test_the_fixes_the_hazard_names_remove_the_breaks(cli_here, fix):
    run = cli_here("trace-attention", "--script", str(SCRIPT), "--", "hf", fix)
    assert run.code == 0, run.stdout + run.stderr
    assert _breaks(run) == _truth("hf", fix)["counter"] == 0
    assert run.check("graph breaks")["status"] == "pass" and not run.findings("graph-break")


@pytest.mark.parametrize(
    ("kind", "marker", "function", "words"),
    [
        ("print", "# the print line", "helper", "print() call"),
        ("item", "# the item line", "with_item", "`.item()`"),
        ("branch", "# the branch line", "with_branch", "data-dependent branch"),
    ],
)
def test_a_break_in_user_code_names_the_users_line_and_reason(cli_here, kind, marker, function, words):
    run = cli_here("trace-attention", "--script", str(SCRIPT), "--", kind)
    assert run.code == 0, run.stdout + run.stderr
    (found,) = run.findings("graph-break")
    where = found["where"]
    assert (where["file"], where["line"], where["function"]) == (str(SCRIPT), _line(marker), function)
    assert words in found["title"] and found["fix"] and "known_cause" not in found["evidence"]
    truth = _truth(kind)
    assert found["evidence"]["breaks"] == _breaks(run) == truth["explain"]
    # dynamo's counter, which the report read before, misses a branch on a tensor; its list has it
    assert truth["counter"] == (0 if kind == "branch" else truth["explain"])


def test_a_healthy_compiled_function_reports_no_break(cli_here):
    run = cli_here("trace-attention", "--script", str(SCRIPT), "--", "healthy")
    assert run.code == 0, run.stdout + run.stderr
    assert _breaks(run) == 0 == _truth("healthy")["explain"]
    assert run.check("graph breaks")["summary"] == "0 graph breaks in the traced run"


def test_run_names_the_break_in_the_process_that_took_it(cli_here):
    run = cli_here("run", "--", sys.executable, str(SCRIPT), "item")
    assert run.code == 0, run.stdout + run.stderr
    (found,) = run.findings("graph-break")
    assert (found["where"]["file"], found["where"]["line"]) == (str(SCRIPT), _line("# the item line"))
    assert found["evidence"]["pid"] and "torch.where" in found["fix"]


def _printing(x: torch.Tensor) -> torch.Tensor:
    print("compiled code printed")
    return x.cos()


def test_the_watch_counts_across_a_dynamo_reset_and_touches_no_logger(fresh_dynamo, capsys):
    """`torch._dynamo.reset()` empties dynamo's list in place: breaks after it are still new. The
    graph-breaks log stays as the process set it (nothing added, nothing enabled)."""
    logger = logging.getLogger("torch._dynamo.symbolic_convert.__graph_breaks")
    before = (list(logger.handlers), logger.level, logger.propagate)
    compiled = torch.compile(_printing, backend="eager")
    compiled(torch.ones(2))  # a break before the watch: not the watch's
    watch = DynamoWatch()
    torch._dynamo.reset()
    compiled(torch.ones(2))
    watch.collect("first")
    torch._dynamo.reset()
    compiled(torch.ones(2))
    watch.collect("second")
    (site,) = watch.graph_break_sites
    assert sum(watch.graph_breaks.values()) == site["count"] == 2
    assert site["site"] == f"{__file__}:{_printing.__code__.co_firstlineno + 1} in _printing"
    assert (list(logger.handlers), logger.level, logger.propagate) == before
    assert "Graph break" not in capsys.readouterr().err
