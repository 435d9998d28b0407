"""The gate runs the team's own trainer under `run` (config key `run`, or `--run`): what only the
real training step shows is found and fails the gate, with its site; the fixed trainer passes. Real
child processes: a real triton autotuner (interpreted) entered by two threads, a tiny HF Llama whose
attention goes through the team's wrapper, a two-rank torchrun over gloo. The gate's probes are cut
to `env` here (the probes have their own tests); each gate is timed by the suite, not asserted."""

from __future__ import annotations

import importlib.util
import shutil
import sys

import pytest

from tests.conftest import run_cli
from tests.paths import TARGETS

GATE = TARGETS / "gate"
RUN = TARGETS / "run"


def _line(path, marker: str) -> int:
    return next(i for i, text in enumerate(path.read_text().splitlines(), 1) if marker in text)


def _gate(tmp_path, run: str, *extra: str, env: dict[str, str] | None = None, config: str = "", limit: int = 240):
    (tmp_path / "dflashdoctor.toml").write_text(f'probes = ["env"]\nrun_timeout = {limit}\n{config}')
    return run_cli(tmp_path, "gate", "--run", run, "--json", *extra, env=env, timeout=400)


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton")
@pytest.mark.parametrize("locked", [False, True])
def test_two_pairs_in_one_autotuner_fail_the_gate_and_the_lock_passes_it(tmp_path, locked):
    trainer = GATE / "threaded_tuner_trainer.py"
    command = f"{sys.executable} {trainer}" + (" --lock" if locked else "")
    # threaded_autotuners = true excuses the race probe's prediction, never what run saw
    result = _gate(tmp_path, command, env={"TRITON_INTERPRET": "1"}, config="threaded_autotuners = true\n")
    entries = result.findings("concurrent-autotuner-entry")
    if locked:
        assert result.code == 0 and not entries, result.stdout[-3000:] + result.stderr[-3000:]
        return
    assert result.code == 1, result.stdout[-3000:] + result.stderr[-3000:]
    (entry,) = entries
    assert entry["severity"] == "error"
    assert entry["where"]["function"] == "launch"  # the line that launched the kernel
    assert f"It entered from {trainer}:{_line(trainer, 'LAUNCH_LINE')} in pair" in entry["detail"]
    sections = {r["probe"] for r in result.report["results"]}
    assert {"env", "run"} <= sections


@pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="needs transformers")
@pytest.mark.parametrize("backend", ["eager", "inductor"])
def test_an_hf_trainer_whose_wrapper_compiles_nothing_fails_naming_its_layers(tmp_path, backend):
    trainer = GATE / "hf_wrapper_trainer.py"
    result = _gate(tmp_path, f"{sys.executable} {trainer} --backend {backend}")
    dense = result.findings("dense-forward")
    if backend == "inductor":
        assert result.code == 0 and not dense, result.stdout[-3000:] + result.stderr[-3000:]
        (process,) = [r for r in result.report["results"] if r["measurements"].get("steps")]
        assert process["measurements"]["steps"] == 3 and process["measurements"]["step_seconds_median"] > 0
        return
    assert result.code == 1, result.stdout[-3000:] + result.stderr[-3000:]
    assert sorted(f["where"]["module"] for f in dense) == ["layers.0.self_attn", "layers.1.self_attn"]
    assert all(f["where"]["file"].endswith("hf_wrapper_trainer.py") for f in dense)
    assert any("eager" in (f.get("fix") or "") for f in dense)


@pytest.mark.skipif(shutil.which("torchrun") is None, reason="needs torchrun")
def test_a_two_rank_torchrun_names_the_planted_rank(tmp_path):
    script = RUN / "ddp_fault_on_one_rank.py"
    result = _gate(tmp_path, f"torchrun --standalone --nproc-per-node 2 {script}")
    assert result.code == 1, result.stdout[-3000:] + result.stderr[-3000:]
    (dense,) = result.findings("dense-forward")
    assert dense["evidence"]["rank"] == 1
    assert (dense["where"]["file"], dense["where"]["line"]) == (str(script), _line(script, "FLEX_LINE"))
    ranks = {r["probe"].split(" (")[0]: r["status"] for r in result.report["results"] if r["probe"].startswith("rank")}
    assert ranks == {"rank 0": "pass", "rank 1": "fail"}


def test_a_run_that_never_reaches_its_steps_is_stopped_at_run_timeout(tmp_path):
    loop = tmp_path / "spins.py"
    loop.write_text("import time\nwhile True:\n    time.sleep(0.05)  # SPIN_LINE\n")
    result = _gate(tmp_path, f"{sys.executable} {loop}", limit=8)
    assert result.code == 1, result.stdout[-3000:] + result.stderr[-3000:]
    assert result.check("watchdog")["status"] == "fail"
    assert result.findings("run-timeout")


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ('run = "python \'unclosed"\n', "cannot be split as a shell would"),
        ("run = []\n", "run must name a command"),
        ('run = "/nonexistent/trainer"\n', "command not found: /nonexistent/trainer"),
        ("run = 5\n", "run in"),
        ('run = "true"\nrun_steps = 0\n', "run_steps"),
        ('run = "true"\nrun_timeout = nan\n', "run_timeout"),
        ('script = "no_such_step.py"\n', "script 'no_such_step.py': no such file"),
    ],
)
def test_a_bad_run_configuration_is_one_line_and_exit_2(tmp_path, config, message):
    (tmp_path / "dflashdoctor.toml").write_text(f'probes = ["env"]\n{config}')
    result = run_cli(tmp_path, "gate", "--json")
    assert result.code == 2 and result.stdout == "", result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and message in result.stderr, result.stderr


def test_script_makes_trace_attention_trace_the_teams_step_not_the_reference_drafter(tmp_path):
    step = tmp_path / "one_step.py"
    step.write_text(
        "import torch\nfrom torch.nn.attention.flex_attention import flex_attention\n"
        "q = torch.randn(1, 2, 64, 16)\nflex_attention(q, q, q)  # RAW_LINE\n"
    )
    (tmp_path / "dflashdoctor.toml").write_text('probes = ["trace-attention"]\nscript = "one_step.py"\n')
    result = run_cli(tmp_path, "gate", "--json", timeout=400)
    assert result.code == 1, result.stdout[-3000:] + result.stderr[-3000:]
    sites = result.report["results"][0]["measurements"]["call_sites"]
    assert [(s["file"], s["line"]) for s in sites if s.get("dense_forward")] == [(str(step), 4)]
    assert "drafter" not in " ".join(str(s.get("module")) for s in sites)
