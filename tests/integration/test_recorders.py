"""The call-site recorders put back everything they patch (never break the patient)."""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest
import torch
import torch.nn.attention.flex_attention as flex_module
from transformers.modeling_utils import AttentionInterface

from dflashdoctor.agent.torch_instruments import TorchInstruments
from dflashdoctor.hooks.flex_calls import FlexCallRecorder
from dflashdoctor.hooks.flex_dense import DenseFlexRecorder
from dflashdoctor.hooks.hf_attention import HFAttentionRecorder
from dflashdoctor.hooks.module_names import ModuleNamer

pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def test_flex_call_recorder_restores_flex_attention_and_torch_compile():
    raw, real_compile = flex_module.flex_attention, torch.compile
    with FlexCallRecorder(DenseFlexRecorder(), ModuleNamer()):
        assert flex_module.flex_attention is not raw
        assert torch.compile is not real_compile
        assert flex_module.flex_attention.__wrapped__ is raw
    assert flex_module.flex_attention is raw
    assert torch.compile is real_compile


class Attention(torch.nn.Module):
    def forward(self, x):
        return flex_module.flex_attention(x, x, x)


class TwoLayers(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.first, self.second = Attention(), Attention()

    def forward(self, x):
        return self.second(self.first(x) * 2)


def test_raw_call_through_the_stand_in_is_recorded_with_its_module():
    dense = DenseFlexRecorder()
    with dense, FlexCallRecorder(dense, ModuleNamer()) as recorder:
        TwoLayers()(torch.randn(1, 2, 32, 16))
    first, second = recorder.sites.values()
    assert (first.module, first.via, first.calls, first.dense_forward) == ("first", "raw flex_attention", 1, 1)
    assert second.module == "second" and first.function == "forward" and first.file == __file__
    assert first.score_matrix_bytes == 1 * 2 * 32 * 32 * 4


def test_a_call_that_raises_raises_as_it_would_unrecorded():
    """The call is counted, but the program sees its own exception, not one from the recording."""
    k = torch.randn(1, 2, 32, 16)
    with pytest.raises(Exception) as plain:
        flex_module.flex_attention((k,), k, k)
    dense = DenseFlexRecorder()
    recorder = FlexCallRecorder(dense, ModuleNamer())
    with dense, recorder, pytest.raises(type(plain.value)) as recorded:
        flex_module.flex_attention((k,), k, k)
    assert str(recorded.value) == str(plain.value)
    (site,) = recorder.sites.values()
    assert site.file == __file__


def test_the_call_in_flight_and_the_last_calls_are_kept_for_out_of_memory_forensics():
    """`run` names the flex call a thread is inside when the allocator fails, and the calls before
    it. The recorder keeps both itself, per thread; the thread's name is read when they are told."""
    inside = []
    # seen as each call's dense kernel is about to run: from inside the call, on its thread
    dense = DenseFlexRecorder(on_event=lambda _event: inside.append(recorder.in_flight.get(threading.get_ident())))
    recorder = FlexCallRecorder(dense, ModuleNamer(), keep_calls=2)

    def three_calls():
        x = torch.randn(1, 2, 32, 16)
        for _ in range(3):
            flex_module.flex_attention(x, x, x)

    worker = threading.Thread(target=three_calls, name="pair-1")
    with dense, recorder:
        worker.start()
        worker.join()
    (site,) = recorder.sites.values()
    assert [call[1] for call in inside] == [site] * 3 and {call[2] for call in inside} == {worker}
    assert [(call[3], call[4]) for call in inside] == [(0, 0), (1, 1), (2, 2)]  # calls, dense forwards before
    assert recorder.in_flight == {} and list(recorder.last_calls) == inside[1:]
    # told after the thread has ended and another has taken its ident (Linux reuses one at once)
    successor = threading.Thread(target=lambda: None, name="pair-2")
    successor.start()
    successor.join()
    told = TorchInstruments._describe(inside[-1])
    assert told is not None and (told["thread"], told["line"], told["calls_before"]) == ("pair-1", site.line, 2)


@pytest.mark.gpu
def test_dense_backward_is_charged_to_the_forward_call_that_caused_it():
    # flex_attention refuses inputs that require grad on the CPU, even eagerly. The dense backward
    # runs on the autograd thread with no user frame on the stack, so only the hooks can name it.
    dense = DenseFlexRecorder(measure_memory=True)
    x = torch.randn(1, 2, 256, 16, device="cuda", requires_grad=True)
    with dense, FlexCallRecorder(dense, ModuleNamer()) as recorder:
        TwoLayers().cuda()(x).sum().backward()
    first, second = recorder.sites.values()
    assert (first.dense_backward, second.dense_backward) == (1, 1)
    backward = [e for e in dense.events if e.kind == "backward"]
    assert [e.forward_site["module"] for e in backward] == ["second", "first"]  # backward runs in reverse
    assert first.dense_backward_peak_bytes >= first.score_matrix_bytes == 2 * 256 * 256 * 4
    assert x.grad is not None and x.grad.abs().sum() > 0


def test_torch_compile_inside_compiled_code_stays_a_no_op_after_the_recorder(tmp_path):
    # Dynamo builds its table of special functions once per process; had it been built while the
    # recorder's torch.compile stood in, the real one would break graphs afterwards. A fresh process
    # is needed: any earlier compile in this one has built the table already.
    script = tmp_path / "compile_inside.py"
    script.write_text(
        "import torch\n"
        "from torch._dynamo.utils import counters\n"
        "from dflashdoctor.hooks.flex_calls import FlexCallRecorder\n"
        "from dflashdoctor.hooks.flex_dense import DenseFlexRecorder\n"
        "from dflashdoctor.hooks.module_names import ModuleNamer\n"
        "with FlexCallRecorder(DenseFlexRecorder(), ModuleNamer()):\n"
        "    torch.compile(lambda x: torch.compile(torch.sin)(x) + 1)(torch.randn(4))\n"
        "torch._dynamo.reset()\n"
        "torch.compile(lambda x: torch.compile(torch.cos)(x) + 1)(torch.randn(4))\n"
        "print(sum(counters['graph_break'].values()))\n"
    )
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "0"


def test_attention_interface_recorder_restores_every_entry():
    before = dict(AttentionInterface._global_mapping)
    with HFAttentionRecorder(None, DenseFlexRecorder(), ModuleNamer()):
        assert all(AttentionInterface._global_mapping[k] is not v for k, v in before.items())
    assert AttentionInterface._global_mapping == before


def test_an_expectation_or_a_recording_entered_twice_says_so():
    """Reusing one `expect_fused()` for two blocks once failed with an AttributeError about
    contextlib's internals, and a reused recording silently reset its marks under the first block."""
    from dflashdoctor.testing import expect_fused
    from dflashdoctor.testing.recording import record

    expectation = expect_fused()
    with expectation:
        pass
    with pytest.raises(RuntimeError, match=r"expect_fused\(\) was entered already"), expectation:
        pass
    recording = record()
    with recording:
        pass
    with pytest.raises(RuntimeError, match="this recording was entered already"), recording:
        pass
