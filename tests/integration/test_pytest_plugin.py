"""dflashdoctor inside a user's own test suite: `dflashdoctor.testing` and the pytest plugin, run as
a user runs them, by real pytest processes on small projects (pytest's own `pytester`).

Each project runs in a subprocess of its own, so what dynamo learns there (a recompile limit hit, a
frame skipped) stays there. A run's outcomes are read from its JUnit XML, test by test.
"""

from __future__ import annotations

import importlib.metadata
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests.paths import ROOT

pytest_plugins = ["pytester"]

# A model as users write one: layers that call flex_attention through whatever `attend` is.
_MODEL = """
import threading

import torch
from torch.nn.attention.flex_attention import flex_attention

compiled = torch.compile(flex_attention)


class Attention(torch.nn.Module):
    def __init__(self, attend):
        super().__init__()
        self.attend = attend

    def forward(self, x):
        return self.attend(x, x, x)


class Model(torch.nn.Module):
    def __init__(self, attend, layers=2):
        super().__init__()
        self.layers = torch.nn.ModuleList(Attention(attend) for _ in range(layers))

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def inputs():
    return torch.randn(1, 2, 128, 16)


def on_a_thread(fn, name):
    thread = threading.Thread(target=fn, name=name)
    thread.start()
    thread.join()
"""


def _outcomes(junit: Path) -> dict[str, tuple[str, str]]:
    """Test name -> (passed, failed or error; the failure message as pytest wrote it, its lines
    joined: the message wraps long sentences)."""
    outcomes = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        problem = next((case.find(tag) for tag in ("failure", "error") if case.find(tag) is not None), None)
        if problem is None:
            outcomes[case.get("name")] = ("passed", "")
        else:
            text = " ".join((problem.text or problem.get("message") or "").split())
            outcomes[case.get("name")] = ("failed" if problem.tag == "failure" else "error", text)
    return outcomes


_PLUGIN = "dflashdoctor.pytest_plugin"


def _installed_plugin() -> bool:
    return any(entry.value == _PLUGIN for entry in importlib.metadata.entry_points(group="pytest11"))


def _run(pytester: pytest.Pytester, *args: str) -> tuple[pytest.RunResult, dict[str, tuple[str, str]]]:
    """pytest on the pytester folder, in a child. The plugin comes by its entry point where this
    package is installed, as users get it; named with `-p` where the checkout is only on the path (a
    GPU node's copy on PYTHONPATH), where pytest would run without it and every marked test pass."""
    junit = pytester.path / "junit.xml"
    plugin = () if _installed_plugin() else ("-p", _PLUGIN)
    result = pytester.runpytest_subprocess(f"--junitxml={junit}", "-p", "no:cacheprovider", *plugin, *args, timeout=600)
    return result, _outcomes(junit)


@pytest.mark.skipif(
    not any(d.metadata["Name"] == "dflashdoctor" for d in importlib.metadata.distributions()),
    reason="the package is not installed here (a checkout on PYTHONPATH)",
)
def test_installing_the_package_registers_the_plugin() -> None:
    """`pip install dflashdoctor` is all a user does for the markers to work: pytest finds the plugin
    by its pytest11 entry point."""
    assert _installed_plugin()


def test_markers_fail_dense_sites_and_pass_fused_ones(pytester: pytest.Pytester) -> None:
    """The issue's project: a raw call fails with its site, the compiled wrapper passes, a dense call
    on another thread counts and is named, nested blocks and a block that raises keep their own
    outcomes and restore the hook, and the fixture gives the events without failing."""
    pytester.makepyfile(model=_MODEL)
    pytester.makepyfile(
        test_attention="""
        import pytest
        import torch
        from torch.nn.attention.flex_attention import flex_attention

        from dflashdoctor.testing import DenseAttentionError, expect_fused
        from model import Model, compiled, inputs, on_a_thread


        @pytest.mark.flex_fused
        def test_raw_call():
            Model(flex_attention)(inputs())


        @pytest.mark.flex_fused
        def test_compiled_wrapper():
            Model(compiled)(inputs())


        @pytest.mark.flex_fused
        def test_dense_on_another_thread():
            x = inputs()
            on_a_thread(lambda: flex_attention(x, x, x), name="loader-7")


        def test_nested_and_raising_blocks():
            from torch._C import DispatchKey
            import torch._higher_order_ops.flex_attention  # noqa: F401
            import sys

            hop = sys.modules["torch._higher_order_ops.flex_attention"].flex_attention
            original = hop.py_kernels[DispatchKey.CompositeExplicitAutograd]
            x = inputs()
            with pytest.raises(DenseAttentionError) as outer:
                with expect_fused():
                    with pytest.raises(DenseAttentionError) as inner:
                        with expect_fused():
                            flex_attention(x, x, x)
                    assert len(inner.value.recording.dense_events) == 1
                    compiled(x, x, x)
            assert len(outer.value.recording.dense_events) == 1  # the inner block's call, seen by both
            with pytest.raises(ValueError, match="the block's own"):
                with expect_fused():
                    flex_attention(x, x, x)
                    raise ValueError("the block's own")
            assert hop.py_kernels[DispatchKey.CompositeExplicitAutograd] is original


        def test_blocks_on_two_threads_that_close_out_of_order():
            # A opens, B opens, A closes: B's hook stays until B closes, and B still sees its call.
            import threading

            from dflashdoctor.testing import record

            x = inputs()
            a_open, a_closed, outcome = threading.Event(), threading.Event(), {}

            def thread_a():
                with record() as seen:
                    a_open.set()
                    b_open.wait(10)
                outcome["a"] = len(seen.dense_events)
                a_closed.set()

            b_open = threading.Event()
            a = threading.Thread(target=thread_a)
            a.start()
            a_open.wait(10)
            with record() as seen_b:
                b_open.set()
                a_closed.wait(10)
                flex_attention(x, x, x)  # after A closed
            a.join()
            assert outcome["a"] == 0 and len(seen_b.dense_events) == 1
            from torch._C import DispatchKey
            import sys

            hop = sys.modules["torch._higher_order_ops.flex_attention"].flex_attention
            assert not hasattr(hop.py_kernels[DispatchKey.CompositeExplicitAutograd], "__wrapped__")


        def test_fixture_gives_the_events(flex_recording):
            x = inputs()
            flex_attention(x, x, x)
            compiled(x, x, x)
            (event,) = flex_recording.dense_events
            assert (event.kind, event.route) == ("forward", "raw")
            assert event.site["function"] == "test_fixture_gives_the_events"
            assert [f.code for f in flex_recording.findings()] == ["dense-forward"]
        """
    )
    result, outcomes = _run(pytester)
    text = result.stdout.str()
    assert outcomes["test_compiled_wrapper"] == ("passed", ""), text
    assert outcomes["test_nested_and_raising_blocks"] == ("passed", ""), text
    assert outcomes["test_fixture_gives_the_events"] == ("passed", ""), text
    assert outcomes["test_blocks_on_two_threads_that_close_out_of_order"] == ("passed", ""), text

    status, raw = outcomes["test_raw_call"]
    assert status == "failed"
    model = str(pytester.path / "model.py")
    line = (pytester.path / "model.py").read_text().splitlines().index("        return self.attend(x, x, x)") + 1
    assert "expect_fused: flex_attention ran its dense kernel 2 times (2 forward, 0 backward) from 2 call sites" in raw
    for layer in ("layers.0", "layers.1"):  # each layer's module, at the line that called flex_attention
        assert f"[error] dense-forward {layer}: flex_attention forward ran the dense kernel (1 call)" in raw
        assert f"at {model}:{line} in forward ({layer})" in raw
    assert "q [1, 2, 128, 16] kv [1, 2, 128, 16] float32 on cpu" in raw
    assert "score matrix of 0.125 MiB" in raw
    assert "Cause: never compiled" in raw
    assert "torch.compile(flex_attention)" in raw  # the fix
    assert "Traceback" not in raw and "pytest_plugin.py" not in raw  # the finding is the whole message

    status, thread = outcomes["test_dense_on_another_thread"]
    assert status == "failed" and "on thread loader-7" in thread

    # the run's summary: watched tests, and each dense site with its counts and tests
    summary = text[text.index("= dflashdoctor =") :]
    assert "3 tests watched; flex_attention ran its dense kernel in 2 of them, from 3 call sites" in summary
    assert f"{model}:{line} in forward (layers.0): forward 1, backward 0 (test_attention.py::test_raw_call)" in summary


def test_a_wrapper_past_the_recompile_limit_fails_naming_the_guard(pytester: pytest.Pytester) -> None:
    """A score_mod reading a changing module global: each value recompiles until dynamo gives up and
    runs flex_attention dense. Both checks name the guard; the first tests (under the limit) pass."""
    pytester.makepyfile(model=_MODEL)
    pytester.makepyfile(
        scores="""
        OFFSET = 0


        def shifted(score, b, h, q_idx, kv_idx):
            return score + OFFSET
        """
    )
    pytester.makepyfile(
        test_limit="""
        import pytest
        import torch

        import scores
        from model import compiled, inputs

        torch._dynamo.config.recompile_limit = 2


        @pytest.mark.flex_fused
        @pytest.mark.no_recompile_fallback
        @pytest.mark.parametrize("offset", [0, 1, 2, 3])
        def test_offset(offset):
            scores.OFFSET = offset
            x = inputs()
            compiled(x, x, x, score_mod=scores.shifted)
        """
    )
    result, outcomes = _run(pytester)
    text = result.stdout.str()
    assert outcomes["test_offset[0]"] == ("passed", ""), text
    assert outcomes["test_offset[1]"] == ("passed", ""), text
    for limited, when in (("test_offset[2]", "during this block"), ("test_offset[3]", "before this block")):
        status, message = outcomes[limited]
        assert status == "failed", text
        assert "Cause: recompile limit" in message
        assert "global scores.OFFSET ==" in message  # the guard, in the user's words
        assert "[error] recompile-limit-fallback Recompile limit (2) hit: dynamo runs `flex_attention`" in message
        assert f"at {pytester.path / 'scores.py'}:5 in shifted" in message  # dynamo's shortened path, made whole
        assert f"It gave up {when}" in message
        assert "fail_on_recompile_limit_hit" in message  # the fix
    assert "recompile-limit-fallback: 2" in text[text.index("= dflashdoctor =") :]


def test_a_skipped_frame_is_a_fallback(pytester: pytest.Pytester) -> None:
    """An exception inside the compiled flex_attention frame makes dynamo skip it for the process:
    the retry and every later call run dense."""
    pytester.makepyfile(
        test_skip="""
        import pytest
        import torch

        from dflashdoctor.reference.faults import retried_call


        @pytest.mark.no_recompile_fallback
        def test_retried():
            x, kv = torch.randn(1, 4, 128, 16), torch.randn(1, 2, 128, 16)  # GQA: the first attempt raises
            retried_call.flex_attention_forward(x, kv, kv)
        """
    )
    _result, outcomes = _run(pytester)
    status, message = outcomes["test_retried"]
    assert status == "failed"
    assert "[error] dynamo-skip-fallback An exception inside the compiled `flex_attention` frame" in message
    assert "raised ValueError" in message and "during this block" in message
    assert "torch._dynamo.reset()" in message


def test_a_transformers_model_on_its_flex_path_passes(pytester: pytest.Pytester) -> None:
    """The docs' model test as it is: transformers compiles flex_attention itself (its own
    singleton), so a model built with attn_implementation="flex_attention" runs fused and passes."""
    pytester.makepyfile(test_model_fused=(ROOT / "docs" / "examples" / "test_model_fused.py").read_text())
    result, outcomes = _run(pytester)
    assert outcomes["test_forward_runs_fused_attention"] == ("passed", ""), result.stdout.str()
    assert "1 test watched; flex_attention ran its dense kernel in 0 of them, from 0 call sites" in result.stdout.str()


def test_the_eager_wrapper_drafter_fails_naming_its_five_layers(pytester: pytest.Pytester) -> None:
    """The reference drafter with a wrapper compiled for the eager backend: every layer's forward is
    dense (on the CPU, forward only), each named by its module, the cause the backend."""
    pytester.makepyfile(
        test_drafter="""
        import torch

        from dflashdoctor.models import build_config
        from dflashdoctor.reference.drafter_step import make_drafter_step
        from dflashdoctor.testing import expect_fused


        def test_eager_wrapper():
            config = build_config("qwen27b-dflash", "tiny")
            _drafter, step = make_drafter_step(config, "cpu", torch.float32, "eager-wrapper", backward=False)
            with expect_fused():
                step()
        """
    )
    _result, outcomes = _run(pytester)
    status, message = outcomes["test_eager_wrapper"]
    assert status == "failed"
    assert "ran its dense kernel 5 times (5 forward, 0 backward) from 5 call sites" in message
    for layer in range(5):
        assert f"[error] dense-forward layers.{layer}.self_attn: flex_attention forward ran the dense kernel" in message
    assert message.count("Cause: eager backend") == 5


def test_the_option_watches_every_test(pytester: pytest.Pytester) -> None:
    """--flex-fused marks the whole run: an unmarked raw call fails, a test that runs no attention passes."""
    pytester.makepyfile(
        test_any="""
        import torch
        from torch.nn.attention.flex_attention import flex_attention


        def test_unmarked_raw_call():
            x = torch.randn(1, 2, 128, 16)
            flex_attention(x, x, x)


        def test_no_attention():
            assert torch.ones(2).sum() == 2
        """
    )
    result, outcomes = _run(pytester, "--flex-fused")
    assert outcomes["test_no_attention"] == ("passed", "")
    status, message = outcomes["test_unmarked_raw_call"]
    assert status == "failed" and "in test_unmarked_raw_call" in message
    assert "2 tests watched; flex_attention ran its dense kernel in 1 of them" in result.stdout.str()


def test_a_project_that_does_not_use_it_is_untouched(pytester: pytest.Pytester) -> None:
    """The plugin loads (entry point) but imports no torch, adds no summary, and changes no outcome."""
    pytester.makepyfile(
        test_plain="""
        import sys


        def test_torch_is_not_imported_by_the_plugin(pytestconfig):
            assert pytestconfig.pluginmanager.has_plugin("dflashdoctor")
            assert "torch" not in sys.modules
            assert not [name for name in sys.modules if name.startswith("dflashdoctor.testing")]
        """
    )
    result, outcomes = _run(pytester)
    assert outcomes == {"test_torch_is_not_imported_by_the_plugin": ("passed", "")}, result.stdout.str()
    assert "= dflashdoctor =" not in result.stdout.str()
    markers = pytester.runpytest_subprocess("--markers").stdout.str()
    assert "@pytest.mark.flex_fused: fail when flex_attention runs its dense kernel" in markers


def test_two_threads_in_one_autotuner_fail_the_check(pytester: pytest.Pytester) -> None:
    """A real triton autotuner (interpreted, no GPU) entered by a second thread while the first is
    benchmarking: the check fails whether or not the overlap crashed, naming both threads."""
    pytest.importorskip("triton")
    pytester.makeconftest(
        """
        import os

        os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported: the kernel runs on the CPU
        """
    )
    pytester.makepyfile(
        test_tuner="""
        import threading

        import pytest

        from dflashdoctor.autotune.stub_kernel import autotuned_add, launch


        def _two_threads(hold):
            inside = threading.Event()
            release = threading.Event()

            def bench_hook():
                if hold and threading.current_thread().name == "pair-0":
                    inside.set()
                    release.wait(10)

            tuner = autotuned_add(bench_hook)
            errors = []

            def call(index):
                try:
                    if index == 1 and hold:
                        inside.wait(10)
                    launch(tuner, index)
                except Exception as exc:  # the race itself may crash a thread
                    errors.append(exc)
                finally:
                    if index == 1:
                        release.set()

            threads = [threading.Thread(target=call, args=(i,), name=f"pair-{i}") for i in range(2)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            return errors


        @pytest.mark.no_shared_autotuner
        def test_overlapping_threads():
            _two_threads(hold=True)


        @pytest.mark.no_shared_autotuner
        def test_one_after_another():
            tuner = autotuned_add(lambda: None)
            for index in range(2):
                launch(tuner, index)
        """
    )
    result, outcomes = _run(pytester)
    assert outcomes["test_one_after_another"] == ("passed", ""), result.stdout.str()
    status, message = outcomes["test_overlapping_threads"]
    assert status == "failed", result.stdout.str()
    assert "expect_no_shared_autotuner: two threads inside one triton autotuner" in message
    assert "[error] concurrent-autotuner-entry Two threads inside the autotuner of `add_kernel` at once" in message
    assert "Threads pair-0 and pair-1" in message


def test_the_plugin_module_imports_no_torch() -> None:
    """Checked in a fresh interpreter too, without pytest's own plugins in the way."""
    import subprocess

    code = "import sys, dflashdoctor.pytest_plugin; print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch'))"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout == "[]\n"


def test_inside_dflashdoctor_run_the_site_is_still_the_users_line(pytester: pytest.Pytester) -> None:
    """`dflashdoctor run -- pytest`: the run's own flex recorder stands between the test and the
    kernel; neither the plugin nor the run names that stand-in as the call site."""
    import subprocess

    pytester.makepyfile(
        test_under_run="""
        import pytest
        import torch
        from torch.nn.attention.flex_attention import flex_attention


        @pytest.mark.flex_fused
        def test_raw():
            x = torch.randn(1, 2, 128, 16)
            flex_attention(x, x, x)
        """
    )
    test_file = pytester.path / "test_under_run.py"
    command = [sys.executable, "-m", "dflashdoctor", "run", "--report-dir", str(pytester.path / "report"), "--"]
    command += [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(test_file)]
    done = subprocess.run(command, cwd=pytester.path, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 1, done.stdout + done.stderr
    line = test_file.read_text().splitlines().index("    flex_attention(x, x, x)") + 1
    assert f"at {test_file}:{line} in test_raw" in done.stdout  # the plugin's failure message
    assert "flex_calls.py" not in done.stdout
