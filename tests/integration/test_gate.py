"""`gate` and `env` for real: the default gate on the embedded reference setup, a configuration that
points at a raw flex_attention target, budgets, the CI formats (JUnit, SARIF 2.1.0, GitHub workflow
commands), bad configurations, and the environment report with secrets redacted. A bad configuration
is refused before any probe starts: those run the gate in this process (`here`), the rest as a child."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from xml.etree import ElementTree as ET

import pytest

from dflashdoctor.observations import load
from dflashdoctor.registry import PROBES
from tests import schemas
from tests.conftest import CliRun, run_cli, run_cli_here, run_main_here
from tests.paths import ROOT

RAW_CALL = "dflashdoctor.reference.faults.raw_call:flex_attention_forward"
RAW_FILE = ROOT / "dflashdoctor" / "reference" / "faults" / "raw_call.py"


def gate(
    tmp_path: Path, *args: str, config: str | None = None, env: dict[str, str] | None = None, here: bool = False
) -> CliRun:
    """The gate as a real child process; `here`: in this process (what the doctor decides before any probe)."""
    if config is not None:
        (tmp_path / "dflashdoctor.toml").write_text(config)
    argv = ("gate", "--junit", str(tmp_path / "junit.xml"), "--sarif", str(tmp_path / "out.sarif"), *args)
    return run_cli_here(tmp_path, *argv, env=env) if here else run_cli(tmp_path, *argv, env=env)


def _sarif_is_valid_2_1_0(document: dict, schema: Path) -> None:
    """Valid against the published schema, and consistent where the schema cannot say (rule indexes)."""
    assert schemas.sarif_errors(document, schema) == []
    (run,) = document["runs"]
    assert run["tool"]["driver"]["name"] == "dflashdoctor"
    rule_ids = [rule["id"] for rule in run["tool"]["driver"]["rules"]]
    assert len(rule_ids) == len(set(rule_ids))
    for result in run["results"]:
        assert rule_ids[result["ruleIndex"]] == result["ruleId"]


def _junit(path: Path, xsds: list[Path]) -> ET.Element:
    """Valid against Jenkins' JUnit XSDs, with the counts CI systems show (GitLab and GitHub test
    reporters read the same attributes without a schema)."""
    assert schemas.junit_errors(path, xsds) == []
    root = ET.parse(path).getroot()
    for suite in root.iter("testsuite"):
        assert int(suite.get("tests")) == len(suite.findall("testcase")) >= 1
        assert int(suite.get("failures")) == len(suite.findall("testcase/failure"))
    return root


def test_default_gate_passes_on_the_embedded_reference_setup(tmp_path, sarif_schema, junit_schemas):
    run = gate(tmp_path)
    assert run.code == 0, run.stdout[-4000:] + run.stderr[-2000:]
    sections = [r["probe"] for r in run.report["results"]]
    assert sections == ["env", "check-compile", "trace-attention", "race", "cache"]
    # each section says the timeout its probe ran with, the probe's own with none configured (cache
    # checks in the doctor's process: it has none)
    ran_with = {r["probe"]: r["measurements"].get("timeout_s") for r in run.report["results"]}
    assert ran_with == {name: PROBES[name].options().timeout_s for name in sections} | {"cache": None}
    race = run.report["results"][3]
    assert race["status"] == "pass" and not [f for f in race["findings"] if f["severity"] == "error"]
    shared = next(f for f in race["findings"] if f["code"] == "autotuner-shared-state")
    assert shared["evidence"]["forced_reproduction"]  # the racy triton, proven, as a warning
    # the folder keeps what each probe wrote, untouched by its judge: each loads as strictly again
    kept = json.loads((run.report_dir / "observations.json").read_text())["probes"]
    assert sorted(kept) == sorted(sections)
    for probe, observations in kept.items():
        load(PROBES[probe].observations, observations, strict=True)
    _sarif_is_valid_2_1_0(json.loads((tmp_path / "out.sarif").read_text()), sarif_schema)
    suites = [s.get("name") for s in _junit(tmp_path / "junit.xml", junit_schemas).iter("testsuite")]
    assert suites == sections


def test_gate_fails_on_a_raw_flex_target_in_every_ci_format(tmp_path, sarif_schema, junit_schemas):
    summary = tmp_path / "summary.md"
    config = f'target = "{RAW_CALL}"\nprobes = ["check-compile"]\n'
    env = {"GITHUB_ACTIONS": "true", "GITHUB_STEP_SUMMARY": str(summary)}
    run = gate(tmp_path, config=config, env=env)
    assert run.code == 1, run.stdout[-4000:]
    failures = [f.get("message") for f in _junit(tmp_path / "junit.xml", junit_schemas).iter("failure")]
    assert any("dense forward" in (m or "") for m in failures)
    sarif = json.loads((tmp_path / "out.sarif").read_text())
    _sarif_is_valid_2_1_0(sarif, sarif_schema)
    dense = [r for r in sarif["runs"][0]["results"] if r["ruleId"] == "dense-forward"]
    assert dense and dense[0]["level"] == "error"
    annotations = [line for line in run.stdout.splitlines() if line.startswith("::error ")]
    expected = f"::error file={RAW_FILE},line="  # outside the test's folder: absolute
    assert any(line.startswith(expected) and "title=dense-forward" in line for line in annotations)
    assert "dense-forward" in summary.read_text()


@pytest.mark.parametrize(
    ("budget", "measured_key"),
    [("max_recompiles = 0", "recompiles"), ("max_compile_seconds = 0.001", "compile_s")],
)
def test_budgets_are_enforced(tmp_path, budget, measured_key):
    run = gate(tmp_path, config=f'probes = ["check-compile"]\n{budget}\n')
    assert run.code == 1, run.stdout[-3000:]
    (over,) = run.findings("budget-exceeded")
    assert over["evidence"]["budget"] == budget.split(" = ")[0]
    measured = run.report["results"][0]["measurements"][measured_key]
    assert over["evidence"]["measured"] == (round(measured, 2) if isinstance(measured, float) else measured)


def test_pyproject_table_is_read_and_flags_override_it(tmp_path):
    table = f'[tool.dflashdoctor]\ntarget = "{RAW_CALL}"\nprobes = ["check-compile"]\n'
    (tmp_path / "pyproject.toml").write_text(table)
    run = gate(tmp_path, "--target", "dflashdoctor.reference.drafter:flex_attention_forward")
    assert run.code == 0, run.stdout[-3000:]
    assert run.report["environment"]["gate_config"].endswith("pyproject.toml")


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ("max_recompile = 3\n", "unknown key 'max_recompile' in {toml}; known keys: "),
        ('max_recompiles = "three"\n', "max_recompiles in {toml} must be int, not str"),
        ('probes = ["check-compile", "lint"]\n', "unknown probe 'lint' in probes; expected some of "),
        ("max_recompiles = [\n", "{toml} is not valid TOML: "),
        ('mask = "diagonal"\n', "unknown mask 'diagonal'; expected one of dflash, causal, none"),
        ("[shape]\nwidth = 3\n", "unknown key 'width' in shape; known keys: batch, heads, "),
        ('[shape]\nheads = "many"\n', "shape.heads must be a whole number from 1 to 2147483647, not 'many'"),
        ('[shape]\ndtype = "int8"\n', "shape.dtype 'int8' is not one of bfloat16, "),
        ('shape = "big"\n', "shape in {toml} must be dict[str, Any], not str"),
    ],
)
def test_bad_configuration_is_one_line_and_exit_2(tmp_path, config, message):
    run = gate(tmp_path, config=config, here=True)
    assert run.code == 2
    assert run.stderr.startswith("dflashdoctor: " + message.format(toml=tmp_path / "dflashdoctor.toml"))
    assert len(run.stderr.strip().splitlines()) == 1


def test_shape_and_mask_from_the_configuration_reach_check_compile(tmp_path):
    config = 'probes = ["check-compile"]\nmask = "causal"\nvary = 2\n[shape]\nheads = 4\nkv_heads = 2\nq_len = 128\n'
    run = gate(tmp_path, config=config)
    assert run.code == 0, run.stdout[-3000:] + run.stderr[-2000:]
    measured = run.report["results"][0]["measurements"]
    assert (measured["shape"]["heads"], measured["shape"]["kv_heads"], measured["shape"]["q_len"]) == (4, 2, 128)
    assert measured["mask"] == "causal" and len(measured["vary"]) == 2


def test_the_configured_timeout_reaches_env_too(tmp_path):
    """The gate's `timeout` is every probe's: env's own short default gives way to it."""
    run = gate(tmp_path, config='probes = ["env", "cache"]\ntimeout = 300\n')
    assert run.code == 0, run.stdout[-3000:] + run.stderr[-2000:]
    ran_with = {r["probe"]: r["measurements"].get("timeout_s") for r in run.report["results"]}
    assert ran_with == {"env": 300, "cache": None}


def test_env_reports_versions_and_hazards_and_redacts_secrets(tmp_path):
    env = {
        "HF_TOKEN": "hf_abcdefghijklmnopqrstuvwxyz",
        "TORCH_HOME_MIRROR_KEY": "plain-looking",
        "TORCH_EXTENSIONS_DIR": "/opt/ext",
        "TORCH_CUSTOM": "ghp_abcdefghijklmnopqrstuvwxyz012345",
        "TORCHDYNAMO_DISABLE": "1",
    }
    run = run_cli(tmp_path, "env", env=env)
    assert run.code == 0, run.stdout[-3000:]
    (result,) = run.report["results"]
    variables = result["measurements"]["variables"]
    assert variables["HF_TOKEN"] == variables["TORCH_HOME_MIRROR_KEY"] == variables["TORCH_CUSTOM"] == "<redacted>"
    assert variables["TORCH_EXTENSIONS_DIR"] == "/opt/ext"
    assert "hf_abcdefghijklmnopqrstuvwxyz" not in (tmp_path / "report" / "report.json").read_text()
    (hazard,) = run.findings("env-hazard")
    assert hazard["evidence"] == {"variable": "TORCHDYNAMO_DISABLE", "value": "1"}
    assert result["measurements"]["torch"].startswith("2.") and result["measurements"]["recompile_limit"] == 8


def test_python_runs_the_probed_side_in_another_virtual_environment(tmp_path):
    """A second venv sharing the packages of the interpreter running the tests (so torch is there),
    through a .pth file: `--system-site-packages` would share the base interpreter's instead, which
    has no torch when the tests themselves run in a venv. The probes run in its interpreter, and the
    report says which."""
    venv = tmp_path / "other-venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    where = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        text=True,
        capture_output=True,
        check=True,
    ).stdout.strip()
    shared = [path for path in sys.path if path.endswith(("site-packages", "dist-packages"))]
    Path(where, "tests-packages.pth").write_text("".join(f"{path}\n" for path in shared))
    run = gate(tmp_path, "--python", python, config='probes = ["env", "check-compile"]\n')
    assert run.code == 0, run.stdout[-3000:] + run.stderr[-2000:]
    env_section = run.report["results"][0]
    assert env_section["measurements"]["executable"] == python
    bad = run_cli(tmp_path, "env", "--python", str(tmp_path / "no-such-python"))
    assert (
        bad.code == 2
        and bad.stderr.strip() == f"dflashdoctor: --python {tmp_path / 'no-such-python'}: no such executable"
    )


def test_gate_skips_the_race_where_triton_is_not_installed(tmp_path, venv_without_triton):
    run = gate(tmp_path, "--python", venv_without_triton, config='probes = ["env", "race"]\n')
    assert run.code == 0, run.stdout[-3000:] + run.stderr[-2000:]
    race = run.report["results"][1]
    assert race["status"] == "skipped" and "no triton autotuner to race" in race["checks"][0]["summary"]
    asked = run_cli(tmp_path, "race", "--python", venv_without_triton)  # asked for directly: bad input
    assert asked.code == 2 and asked.stderr.strip().startswith("dflashdoctor: triton is not importable")


def test_env_survives_a_cache_root_inside_a_symlink_loop(tmp_path):
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    run = run_cli(tmp_path, "env", env={"TRITON_CACHE_DIR": str(tmp_path / "a" / "cache")})
    assert run.code == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert run.report["results"][0]["status"] == "pass"


def test_a_gate_that_ended_on_bad_input_leaves_the_next_gate_in_this_process_its_probes(tmp_path):
    """A probe's bad input ends the gate (exit 2), which stops the probes still running. That stop
    was the process's for good: every probe a later gate in the same process (the pytest plugin, a
    notebook, these in-process tests) started was killed at once, as `probe env was killed by signal
    9` in 0.0 s. The stop belongs to the gate that ended."""
    bad = tmp_path / "bad.toml"
    bad.write_text('target = "no_such_module_here:fn"\nprobes = ["check-compile", "env"]\n')
    done = run_main_here(tmp_path, ["gate", "--config", str(bad), "--report-dir", str(tmp_path / "r1")])
    assert done.returncode == 2 and "no_such_module_here" in done.stderr, done.stdout[-2000:] + done.stderr[-2000:]
    (tmp_path / "dflashdoctor.toml").write_text('probes = ["env"]\n')
    done = run_main_here(tmp_path, ["gate", "--report-dir", str(tmp_path / "r2")])
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
