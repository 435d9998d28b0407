"""The lint rules on planted files (tests/targets/lint/faulty, one per code, the line marked) and
their healthy twins, and the facts behind them on the spellings real code uses."""

from __future__ import annotations

import pytest

from dflashdoctor.lint.facts import file_facts
from dflashdoctor.lint.rules import judge_file
from tests.paths import TARGETS

FAULTY = TARGETS / "lint" / "faulty"
HEALTHY = TARGETS / "lint" / "healthy"

# code -> (planted file, the marker on the line it must name)
CASES = {
    "lint-raw-flex-call": ("raw_call.py", "RAW_CALL"),
    "lint-wrapper-not-inductor": ("eager_wrapper.py", "EAGER_WRAPPER"),
    "lint-wrapper-rebound": ("rebound.py", "REBOUND_LINE"),
    "lint-mod-reads-global": ("global_mask.py", "GLOBAL_READ"),
}


def _judged(source: str, path: str = "x.py"):
    return judge_file(file_facts(path, source))


@pytest.mark.parametrize("code", CASES)
def test_each_rule_fires_on_its_planted_line_at_its_severity(code):
    name, marker = CASES[code]
    path = FAULTY / name
    line = next(i for i, text in enumerate(path.read_text().splitlines(), 1) if marker in text)
    found = [f for f in _judged(path.read_text(), str(path)) if f.code == code]
    assert [(f.where.file, f.where.line) for f in found][:1] == [(str(path), line)]
    assert all(f.fix for f in found)


def test_the_healthy_twins_have_no_finding():
    for path in HEALTHY.glob("*.py"):
        assert _judged(path.read_text(), str(path)) == [], path


def test_a_call_in_a_disabled_function_is_raw_and_says_why():
    path = FAULTY / "raw_call.py"
    (disabled,) = [f for f in _judged(path.read_text(), str(path)) if f.where.function == "debug_attention"]
    assert "torch.compiler.disable" in disabled.detail


@pytest.mark.parametrize(
    "source",
    [
        "import torch.nn.attention.flex_attention as fa\ndef f(q):\n    return fa.flex_attention(q, q, q)\n",
        "import torch\ndef f(q):\n    return torch.nn.attention.flex_attention.flex_attention(q, q, q)\n",
        "from torch.nn.attention import flex_attention as fa\ndef f(q):\n    return fa.flex_attention(q, q, q)\n",
        "from torch.nn.attention.flex_attention import flex_attention as fx\ndef f(q):\n    return fx(q, q, q)\n",
    ],
)
def test_every_spelling_of_the_raw_function_is_known(source):
    assert [f.code for f in _judged(source)] == ["lint-raw-flex-call"]


def test_a_wrapper_from_torch_compile_imported_bare_with_aot_eager_fires():
    source = (
        "from torch import compile\nfrom torch.nn.attention.flex_attention import flex_attention\n"
        "wrapped = compile(flex_attention, backend='aot_eager')\n"
    )
    (found,) = _judged(source)
    assert found.code == "lint-wrapper-not-inductor" and found.evidence["bound_to"] == ["wrapped"]


@pytest.mark.parametrize(
    "source",
    [
        # transformers' singleton: a None placeholder on the class, filled by torch.compile in __init__
        "import torch\nfrom torch.nn.attention.flex_attention import flex_attention\nclass W:\n"
        "    _compiled = None\n    @torch.compiler.disable(recursive=False)\n    def __init__(self):\n"
        "        self._compiled = torch.compile(flex_attention)\n",
        # another name for flex_attention, never a compiled wrapper
        "from torch.nn.attention.flex_attention import flex_attention\nattention = flex_attention\n",
        # a backend given by a variable: not provably wrong
        "import torch\nfrom torch.nn.attention.flex_attention import flex_attention\nb = 'inductor'\n"
        "w = torch.compile(flex_attention, backend=b)\n",
        # a mask_mod reading a module-level number nobody rebinds (a constant)
        "from torch.nn.attention.flex_attention import create_block_mask\nWINDOW = 128\n"
        "def sliding(b, h, q, kv):\n    return q - kv < WINDOW\nm = create_block_mask(sliding, None, None, 8, 8)\n",
        # a file that calls some other flex_attention (a module's method of that name)
        "def f(self, q):\n    return self.flex_attention(q, q, q)\n",
    ],
)
def test_what_real_code_does_that_is_not_a_fault_is_left_alone(source):
    assert _judged(source) == []
