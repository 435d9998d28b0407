"""FLA's flags read from its source (fla_source.py) are the ones importing `fla.utils` gives, without
importing it: env says the same about FLA and initialises no CUDA for it; race reports FLA's version
without importing `fla`. Each side runs in its own interpreter, so nothing one imports helps the
other. All but the miniature-source test need fla-core (the fla extra)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from dflashdoctor.fla_guards import fla_folder, fla_guards
from dflashdoctor.fla_source import Facts, SourceFlags, Unknown

ROOT = Path(__file__).resolve().parents[2]
needs_fla = pytest.mark.skipif(fla_folder() is None, reason="needs fla-core (the fla extra)")
HOPPER_WITH_TRITON_3_6 = {"IS_NVIDIA_HOPPER": True, "TRITON_ABOVE_3_4_0": True, "TRITON_ABOVE_3_7_1": False}

LOADED = "[m for m in sys.modules if m == 'fla' or m.startswith('fla.')]"
IMPORTED_FLAGS = f"""
import json, sys
from dflashdoctor.fla_guards import fla_flags, fla_state
platform, flags = fla_flags()
print(json.dumps({{"platform": platform, "flags": flags, "state": fla_state(), "loaded": {LOADED}}}))
"""
READ_FLAGS = f"""
import json, os, runpy, sys
import torch
from dflashdoctor.fla_guards import fla_folder
from dflashdoctor.fla_source import SourceFlags, Unknown, machine_facts
env = runpy.run_path({str(ROOT / "probes" / "env.py")!r})
gpu0 = env["gpu_zero"](env["_smi_gpus"]()[0], dict(os.environ))
flags = SourceFlags(fla_folder(), machine_facts(gpu0))
values = {{}}
for name in flags:
    try:
        values[name] = flags[name]
    except KeyError:
        pass
    except Unknown:
        values[name] = "unknown"
state = env["run"]({{}})["fla"]
print(json.dumps({{"platform": flags.platform(), "flags": values, "state": state, "loaded": {LOADED},
                  "cuda_initialised": torch.cuda.is_initialized()}}))
"""


def _json(code: str, **env: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **env},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@needs_fla
def test_env_says_what_importing_fla_utils_says_without_importing_it():
    """Every flag fla.utils holds is read from source to the same value, or (a flag no guard names,
    like IS_GATHER_SUPPORTED's hasattr) left unknown; the env probe's FLA state is key for key the
    one fla_state() gives by importing, and the probe loaded no FLA module and initialised no CUDA."""
    imported, read = _json(IMPORTED_FLAGS), _json(READ_FLAGS)
    assert imported["loaded"] and not read["loaded"]
    assert read["platform"] == imported["platform"]
    assert read["state"] == imported["state"]
    assert not read["cuda_initialised"]
    named = {name for guard in read["state"]["guards"] for name in guard["flags"]}
    assert named and all(read["flags"][name] != "unknown" for name in named)
    for name, value in imported["flags"].items():
        assert read["flags"].get(name) in (value, "unknown"), name


def _backward_guard(flags: SourceFlags):
    return next(g for g in fla_guards(flags) if g.function == "chunk_bwd_dqkwg")


@needs_fla
def test_the_installed_fla_source_refuses_the_gated_backward_on_a_hopper_with_triton_3_6():
    """FLA's own expressions with an H200's facts (what nvidia-smi says of GPU 0, triton 3.6.0) hold
    the guard fla-core 0.6.0 raises there (seen on an H200, tests/assets/observations/h200/env-fla);
    an A100, or triton 3.7.1, does not."""
    hopper = SourceFlags(fla_folder(), Facts("cuda", ("NVIDIA H200", (9, 0)), "3.6.0"))
    guard = _backward_guard(hopper)
    assert guard.applies and guard.flags == HOPPER_WITH_TRITON_3_6 and hopper.platform() == "cuda"
    assert hopper["IS_TF32_SUPPORTED"] and not hopper["IS_NVIDIA_BLACKWELL"]
    ampere = SourceFlags(fla_folder(), Facts("cuda", ("NVIDIA A100-SXM4-80GB", (8, 0)), "3.6.0"))
    assert not _backward_guard(ampere).applies and not ampere["IS_NVIDIA_HOPPER"]
    assert not _backward_guard(SourceFlags(fla_folder(), Facts("cuda", ("NVIDIA H200", (9, 0)), "3.7.1"))).applies


@needs_fla
def test_a_gpu_platform_without_a_known_gpu_zero_is_unknown_not_guessed():
    """Where nvidia-smi cannot say which GPU is device 0, FLA's question about it is Unknown, and env
    imports fla.utils instead (fla_state_from_source)."""
    flags = SourceFlags(fla_folder(), Facts("cuda", None, "3.6.0"))
    assert flags["IS_NVIDIA"]
    with pytest.raises(Unknown):
        flags["IS_NVIDIA_HOPPER"]
    with pytest.raises(Unknown):
        _backward_guard(flags)
    assert not SourceFlags(fla_folder(), Facts("cpu", None, "3.6.0"))["IS_NVIDIA_HOPPER"]  # short-circuits


MINIATURE = {
    "__init__.py": """
        from .hardware import IS_A, IS_B, IS_C, IS_D, device_platform
        from fla.utils.env import TRITON_ABOVE_3_0_0
        """,
    "hardware.py": """
        import torch
        import triton as tr
        from fla.utils.env import TRITON_ABOVE_3_0_0

        def get_available_device():
            return 'cpu'

        device_platform = get_available_device()
        IS_A = device_platform == 'cuda' and torch.cuda.get_device_capability(0)[0] >= 9
        IS_B = TRITON_ABOVE_3_0_0 and len('x') == 1
        IS_C = 1
        IS_C = 2
        if IS_A:
            IS_D = True
        """,
    "env.py": """
        from packaging import version as v
        import triton
        TRITON_ABOVE_3_0_0 = v.parse(triton.__version__) >= v.parse('3.0.0')
        """,
}


def test_only_what_is_answered_here_is_evaluated(tmp_path):
    """A miniature fla/utils: relative and absolute imports, FLA's backend question and a GPU 0 fact
    are answered; a call not answered here (len), a name bound twice (IS_C) or inside a block (IS_D)
    is Unknown."""
    utils = tmp_path / "utils"
    utils.mkdir()
    for name, text in MINIATURE.items():
        (utils / name).write_text(textwrap.dedent(text))
    flags = SourceFlags(str(tmp_path), Facts("cuda", ("NVIDIA H200", (9, 0)), "3.6.0"))
    assert flags.platform() == "cuda" and flags["IS_A"] and flags["TRITON_ABOVE_3_0_0"]
    assert not SourceFlags(str(tmp_path), Facts("cuda", ("NVIDIA H200", (9, 0)), "2.3.0"))["TRITON_ABOVE_3_0_0"]
    for name in ("IS_B", "IS_C", "IS_D"):
        with pytest.raises(Unknown):
            flags[name]
    with pytest.raises(KeyError):
        flags["IS_NOT_THERE"]


RACE = """
import json, runpy, sys
race = runpy.run_path(sys.argv[1])
config = {"threads": 2, "kernel": "stub", "trials": 1, "fix": "none", "seed": 0, "processes": 0,
          "trials_budget_s": 60.0, "binaries_dir": None}
print(json.dumps({"fla": race["run"](config)["fla"], "loaded": [m for m in sys.modules if m.startswith("fla")]}))
"""


@needs_fla
def test_race_reports_fla_s_version_without_importing_fla():
    seen = _json(RACE.replace("sys.argv[1]", repr(str(ROOT / "probes" / "race.py"))), TRITON_INTERPRET="1")
    version = _json("import json, fla; print(json.dumps({'version': fla.__version__}))")["version"]
    assert seen == {"fla": version, "loaded": []}


@needs_fla
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_a_gpu_env_reads_fla_s_flags_without_initialising_cuda():
    """The point of reading FLA from source: on a GPU importing fla.utils initialises CUDA (seconds
    of the gate's env probe on an H200); the source read does not, and says the same."""
    imported, read = _json(IMPORTED_FLAGS), _json(READ_FLAGS)
    assert read["platform"] == imported["platform"] == "cuda"
    assert read["state"] == imported["state"] and not read["cuda_initialised"]
