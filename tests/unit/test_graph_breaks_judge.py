"""Graph breaks judged from recorded runs: each names its site, dynamo's reason in plain words and the
fix for that reason, and the break every HF model compiled whole takes is named as a known hazard.

Recordings (tests/assets/observations/README.md): `cpu/trace-hf-graph-breaks` is trace-attention on
a tiny HF Llama compiled whole (tests/targets/graph_breaks.py hf); `cpu/trace-script-graph-breaks` a
user function with a print() in a helper (graph_breaks.py print); `cpu/check-compile-graph-break`
predates site records, and stands for every report written before them.
"""

from __future__ import annotations

from dataclasses import asdict, replace
from pathlib import Path

from dflashdoctor.judges.graph_breaks import HF_MASK_FLAG, MASK_FLAG, read_break
from dflashdoctor.observations import TraceAttentionObservations, load
from tests.paths import TARGETS
from tests.unit.recorded import documented, judged, observations, raw

CASES = {"graph-break": "cpu/trace-hf-graph-breaks", "framework-graph-break": "cpu/trace-ddp-graph-breaks"}
SCRIPT = TARGETS / "graph_breaks.py"
TAIL = "tests/targets/graph_breaks.py"


def _line(marker: str) -> int:
    """The line of the target script that carries `marker` in its comment."""
    lines = SCRIPT.read_text(encoding="utf-8").splitlines()
    return next(number for number, text in enumerate(lines, 1) if marker in text)


def test_the_hf_model_break_is_the_known_hazard_at_transformers_line():
    (result,) = judged("cpu/trace-hf-graph-breaks")
    (found,) = documented([result], "graph-break")
    assert result.status == "pass"  # a warning: the model still ran, compiled, in pieces
    assert found.where.file.replace("\\", "/").endswith("transformers/masking_utils.py")
    assert found.where.function == "flex_attention_mask"
    assert found.evidence["known_cause"] == HF_MASK_FLAG
    assert found.evidence["breaks"] == result.measurements["graph_breaks"] == 8
    assert "_warnings.warn" in found.evidence["reason"]
    assert (
        found.evidence["broke_at"]
        .replace("\\", "/")
        .split("site-packages/")[-1]
        .startswith("torch/nn/attention/flex_attention.py:")
    )
    assert "create_block_mask(_compile=True)" in found.title and "transformers" in found.title
    assert "ignore_logging_functions.add(warnings.warn)" in found.fix and "layer.compile()" in found.fix
    assert "filterwarnings" in found.fix  # what does not help is said too
    assert found.refs and found.refs[0].startswith("https://")  # dynamo's page for this break
    (check,) = [c for c in result.checks if c.name == "graph breaks"]
    assert check.status == "warn"
    assert check.summary.endswith(f"at masking_utils.py:{found.where.line} in flex_attention_mask")


def test_a_user_break_names_the_users_line_and_the_fix_for_its_reason():
    (found,) = documented(judged("cpu/trace-script-graph-breaks"), "graph-break")
    where, entry = found.where, found.evidence["entry"]  # recorded in another checkout: compare from tests/ on
    assert where.file.endswith(TAIL) and (where.line, where.function) == (_line("# the print line"), "helper")
    assert entry.split(":")[0].endswith(TAIL) and entry.endswith(" in with_print")
    assert found.evidence["breaks"] == 2 and "known_cause" not in found.evidence
    assert "print() call" in found.title and "print" in found.fix and "reorderable_logging_functions" in found.fix
    assert "TORCH_LOGS" not in found.fix


def test_a_record_without_sites_still_says_the_reason_and_its_fix():
    """Reports from before sites were recorded, and a torch that records none: one finding per section,
    the count as before, the reasons in plain words and the fix for the most frequent."""
    (found,) = documented(judged("cpu/trace-script-graph-breaks", graph_break_sites=[]), "graph-break")
    assert found.title == "2 graph breaks in the traced run" and found.where is None
    assert "a print() call, which dynamo cannot put in a graph (2)" in found.detail
    assert "reorderable_logging_functions" in found.fix
    (explicit,) = documented(judged("cpu/check-compile-graph-break", graph_break_sites=[]), "graph-break")
    assert explicit.title == "1 graph breaks while the target ran"
    assert explicit.fix == "Remove the `torch._dynamo.graph_break()` call if it was left from debugging."


def test_old_observations_without_the_field_load_with_no_sites():
    data = raw("cpu/trace-script-graph-breaks")
    del data["graph_break_sites"]
    assert load(TraceAttentionObservations, data).graph_break_sites == []


def test_check_compile_names_sites_through_the_same_judge():
    """check-compile's judge reads the same field as trace-attention's."""
    (reason,) = raw("cpu/check-compile-graph-break")["graph_breaks"]
    where = "/u/faults.py:15 in breaks"
    site = {"reason": reason, "count": 1, "site": where, "broke_at": where, "entry": where, "stack": [where]}
    (found,) = documented(judged("cpu/check-compile-graph-break", graph_break_sites=[site]), "graph-break")
    explicit = "an explicit `torch._dynamo.graph_break()`"
    assert found.title == f"1 graph break while the target ran at faults.py:15 in breaks: {explicit}"
    assert (found.where.file, found.where.line) == ("/u/faults.py", 15)


def test_the_sites_with_most_breaks_are_named_and_every_site_counted():
    (site,) = observations("cpu/trace-script-graph-breaks").graph_break_sites
    sites = [asdict(replace(site, site=f"/u/train.py:{n} in step", count=10 - n)) for n in range(7)]
    (result,) = judged("cpu/trace-script-graph-breaks", graph_break_sites=sites)
    named = documented([result], "graph-break")
    assert [f.where.line for f in named] == [0, 1, 2, 3, 4]
    (check,) = [c for c in result.checks if c.name == "graph breaks"]
    assert check.summary == "2 graph breaks in the traced run at 7 sites (the 5 with most breaks are named)"


def test_reasons_in_dynamo_words_and_in_older_terse_ones():
    assert read_break("generic_jump TensorVariable()").plain.startswith("a Python `if` or `while` on a tensor")
    unknown = read_break(
        "Unsupported method call\n  Explanation: Dynamo does not know how to trace method `foo` of class `Bar`.\n"
        "  Hint: Avoid calling `Bar.foo` in your code.\n  Hint: Please report an issue to PyTorch.\n"
    )
    assert unknown.plain == "Dynamo does not know how to trace method `foo` of class `Bar`"
    assert unknown.fix == "Avoid calling `Bar.foo` in your code." and unknown.hazard is None


def test_create_block_mask_with_the_flag_in_user_code_is_the_hazard_with_its_own_fix():
    site = raw("cpu/trace-hf-graph-breaks")["graph_break_sites"][0]
    user = "/home/me/train.py:15 in masks"
    reading = read_break(site["reason"], user, [user, site["broke_at"]], user)
    assert reading.hazard == MASK_FLAG and reading.fix.startswith(f"Drop `_compile=True` at {user}")
    plain_warning = read_break(site["reason"], user, [user], user)  # a warnings.warn of the user's own
    assert plain_warning.hazard is None and "ignore_logging_functions" in plain_warning.fix


def test_check_compile_names_the_site_its_probe_recorded():
    """The probe writes the watch's sites (before the strict load it wrote none, and the judge,
    reading a default, could name no line)."""
    (found,) = documented(judged("cpu/check-compile-graph-break"), "graph-break")
    assert (Path(found.where.file).name, found.where.line, found.where.function) == ("compiled_faults.py", 15, "breaks")


def test_ddps_own_breaks_are_a_note_and_the_section_passes():
    """DDP's forward context is on dynamo's do-not-trace list: a break by design, not the user's to
    fix; the flex calls inside the pieces are fused, so nothing is a warning."""
    (result,) = judged("cpu/trace-ddp-graph-breaks")
    (found,) = documented([result], "framework-graph-break")
    assert found.severity == "info" and not [f for f in result.findings if f.code == "graph-break"]
    assert "_inside_ddp_forward" in found.title and "Nothing to change" in found.fix
    (check,) = [c for c in result.checks if c.name == "graph breaks"]
    assert check.status == "pass" and "a framework's own, on purpose" in check.summary
    rows = [r for r in result.measurements["call_sites"] if r["impl"] == "flex_attention"]
    assert {r["module"] for r in rows} == {"module.layers.0", "module.layers.1"}
    assert all(r["verdict"] == "fused" for r in rows) and result.status == "pass"
