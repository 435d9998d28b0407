"""The lint rules on planted files (tests/targets/lint/faulty, one per code, the line marked) and
their healthy twins, and the facts behind them on the spellings real code uses."""

from __future__ import annotations

from pathlib import Path

import pytest

from dflashdoctor.lint.facts import file_facts
from dflashdoctor.lint.project import Project
from dflashdoctor.lint.rules import call_kind, judge_file
from tests.paths import TARGETS

FAULTY = TARGETS / "lint" / "faulty"
HEALTHY = TARGETS / "lint" / "healthy"

# code -> (planted file, the marker on the line it must name)
CASES = {
    "lint-raw-flex-call": ("raw_call.py", "RAW_CALL"),
    "lint-wrapper-not-inductor": ("eager_wrapper.py", "EAGER_WRAPPER"),
    "lint-wrapper-rebound": ("rebound.py", "REBOUND_LINE"),
    "lint-mod-reads-global": ("global_mask.py", "GLOBAL_READ"),
    "lint-wrapper-static-varying": ("static_varying.py", "STATIC_WRAPPER"),
    "lint-threaded-model-call": ("threaded_step.py", "POOL_STEP"),
    "lint-raw-flex-call-on-purpose": ("eager_reference.py", "ON_PURPOSE"),
}


def _judged(source: str, path: str = "x.py"):
    facts = file_facts(path, source)
    facts.relative = Path(path).name  # as lint sets it: the planted files stand for a project's own
    return judge_file(facts)


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


_FLEX = "import torch\nfrom torch.nn.attention.flex_attention import flex_attention\n"
_THREADS = "import threading\nfrom concurrent.futures import ThreadPoolExecutor\nfrom functools import partial\n"


def _codes(source: str) -> list[tuple[str, int]]:
    return [(f.code, f.where.line) for f in _judged(source)]


@pytest.mark.parametrize(
    "source",
    [
        # the wrapper called in a loop with a length the loop sets
        _FLEX + "w = torch.compile(flex_attention, dynamic=False)\nfor n in (64, 128):\n"
        "    q = torch.randn(1, 4, n, 16)\n    w(q, q, q)\n",
        # compile(dynamic=False) applied to flex_attention, a length from len() of each batch
        _FLEX + "w = torch.compile(dynamic=False)(flex_attention)\ndef run(batches, q):\n"
        "    for batch in batches:\n        n = len(batch)\n        w(q[:, :, :n], q, q)\n",
        # a partial of flex_attention, a comprehension of lengths
        _FLEX + "from functools import partial\nw = torch.compile(partial(flex_attention, scale=1.0), dynamic=False)\n"
        "outs = [w(torch.zeros(1, 4, n, 16), None, None) for n in (64, 128)]\n",
        # partial(torch.compile, dynamic=False) as a decorator, a length that grows in a while loop
        _FLEX + "from functools import partial\n@partial(torch.compile, dynamic=False)\ndef attend(q):\n"
        "    return flex_attention(q, q, q)\nn = 16\nwhile n < 512:\n    n *= 2\n    attend(torch.ones(1, 4, n, 16))\n",
        # tensors drawn from a list built with many lengths; .narrow's length from the batch's shape
        _FLEX + "w = torch.compile(flex_attention, dynamic=False)\ndef run(q, batches):\n"
        "    ragged = [torch.randn(1, 4, n, 16) for n in (64, 128)]\n    for x in ragged:\n        w(x, x, x)\n",
        _FLEX + "w = torch.compile(flex_attention, dynamic=False)\ndef run(q, batches):\n"
        "    for b in batches:\n        k = q.narrow(2, 0, b.shape[1])\n        w(q, k, k)\n",
        # an attribute of the class, called through self in a method, through a forwarding method
        _FLEX + "class A:\n    def __init__(self):\n        self.w = torch.compile(flex_attention, dynamic=False)\n"
        "    def attend(self, q):\n        return self.w(q, q, q)\n    def run(self, q, lengths):\n"
        "        for n in lengths:\n            self.attend(torch.nn.functional.pad(q, (0, 0, 0, n)))\n",
    ],
)
def test_a_static_wrapper_called_with_lengths_that_vary_fires_at_its_compile(source):
    (found,) = _judged(source)
    assert found.code == "lint-wrapper-static-varying" and found.severity == "warning"
    compile_line = next(i for i, t in enumerate(source.splitlines(), 1) if "dynamic=False" in t)
    assert found.where.line == compile_line and "dynamic=False" in found.fix and "pad" in found.fix


def test_the_static_finding_names_the_call_the_loop_and_how_many():
    path = FAULTY / "static_varying.py"
    lines = path.read_text().splitlines()
    at = {m: next(i for i, t in enumerate(lines, 1) if m in t) for m in ("VARYING_CALL", "GROWING_CALL")}
    first, second = [f for f in _judged(path.read_text(), str(path)) if f.code == "lint-wrapper-static-varying"]
    assert first.evidence["call_line"] == at["VARYING_CALL"] and "compile_friendly_flex_attention" in first.detail
    assert second.evidence["call_line"] == at["GROWING_CALL"] and second.evidence["wrapper"] == "Decoder.attend"
    twice = (
        _FLEX + "w = torch.compile(flex_attention, dynamic=False)\n"
        "for n in (1, 2):\n    w(torch.ones(1, 1, n, 8), None, None)\n"
        "for m in (3, 4):\n    w(torch.ones(1, 1, m, 8), None, None)\n"
    )
    (found,) = _judged(twice)
    assert "(2 such calls)" in found.detail and found.evidence["call_line"] == 5


@pytest.mark.parametrize(
    "source",
    [
        # transformers' singleton: dynamic=False compiled in __init__, called through a local name
        "import torch\nfrom torch.nn.attention.flex_attention import flex_attention\nclass W:\n"
        "    _compiled = None\n    def __init__(self):\n"
        "        self._compiled = torch.compile(flex_attention, dynamic=False)\n    def __call__(self):\n"
        "        return self._compiled\ndef attend(q, k, v):\n    compiled = W()()\n    return compiled(q, k, v)\n",
        # one fixed length, every step
        _FLEX + "w = torch.compile(flex_attention, dynamic=False)\nfor _ in range(8):\n"
        "    q = torch.randn(1, 4, 512, 16)\n    w(q, q, q)\n",
        # a sliding window: both ends of the slice move, its length does not
        _FLEX + "w = torch.compile(flex_attention, dynamic=False)\ndef run(q):\n    for i in range(4):\n"
        "        c = q[:, :, i * 64:(i + 1) * 64]\n        w(c, c, c)\n",
        # batches passed on: nothing in the source says their lengths differ
        _FLEX + "w = torch.compile(flex_attention, dynamic=False)\ndef run(batches):\n    for b in batches:\n"
        "        w(b, b, b)\n",
        # lengths that vary, but the wrapper is dynamic (the default)
        _FLEX + "w = torch.compile(flex_attention)\nfor n in (64, 128):\n    w(torch.randn(1, 4, n, 16), None, None)\n",
        # dynamic=False on something that is not flex_attention
        _FLEX + "m = torch.compile(torch.nn.Linear(4, 4), dynamic=False)\nfor n in (1, 2):\n    m(torch.randn(n, 4))\n",
        # a call in a function nested in the loop's function, never called: not followed
        _FLEX + "w = torch.compile(flex_attention, dynamic=False)\ndef run(lengths):\n    for n in lengths:\n"
        "        def later():\n            return w(torch.randn(1, 4, n, 16), None, None)\n",
    ],
)
def test_a_static_wrapper_whose_lengths_do_not_visibly_vary_is_left_alone(source):
    assert _judged(source) == []


@pytest.mark.parametrize(
    "source",
    [
        # threading.Thread on a module-level function that steps an optimizer
        _THREADS + "def work(optimizer):\n    optimizer.step()\nthreading.Thread(target=work, args=(o,)).start()\n",
        # pool.submit on a method, through self, that calls the model
        _THREADS + "class T:\n    def step(self, x):\n        return self.model(x)\n    def run(self, xs):\n"
        "        with ThreadPoolExecutor(2) as pool:\n            return [pool.submit(self.step, x) for x in xs]\n",
        # a partial of a closure, reaching the backward through a helper of the file
        _THREADS + "def train(model, xs):\n    def loss_of(x):\n        return model(x).sum()\n"
        "    def helper(x):\n        loss_of(x).backward()\n    def work(x, scale):\n        helper(x)\n"
        "    pool = ThreadPoolExecutor(2)\n    pool.map(partial(work, scale=2), xs)\n",
        # a lambda calling a wrapper this file compiles
        _THREADS + "import torch\nstep = torch.compile(lambda x: x + 1)\n"
        "threading.Thread(target=lambda: step(1)).start()\n",
        # a function decorated @torch.compile, run from a ThreadPool's map
        _THREADS + "import torch\nfrom multiprocessing.pool import ThreadPool\n@torch.compile\ndef f(x):\n"
        "    return x * 2\ndef work(x):\n    return f(x)\nThreadPool(2).map(work, [1, 2])\n",
    ],
)
def test_a_model_or_kernel_step_started_on_threads_fires_where_the_thread_starts(source):
    (found,) = _judged(source)
    assert found.code == "lint-threaded-model-call" and found.severity == "warning"
    start = next(i for i, t in enumerate(source.splitlines(), 1) if "Thread(" in t or "pool." in t or ".map(" in t)
    assert found.where.line == start and "lock" in found.fix and "torchrun" in found.fix


def test_the_threaded_finding_names_the_path_to_the_step():
    source = (
        _THREADS + "def train(model, xs):\n    def loss_of(x):\n        return model(x).sum()\n"
        "    def work(x):\n        loss_of(x)\n    ThreadPoolExecutor(2).map(work, xs)\n"
    )
    (found,) = _judged(source)
    assert found.evidence["via"] == ["loss_of"] and found.evidence["step_line"] == 6 and "loss_of" in found.detail


@pytest.mark.parametrize(
    "source",
    [
        # the fix: one lock around the step
        _THREADS + "lock = threading.Lock()\ndef work(model, x):\n    with lock:\n        model(x)\n"
        "threading.Thread(target=work).start()\n",
        # a target this file does not define: not guessed at
        _THREADS + "from elsewhere import step\nthreading.Thread(target=step).start()\n",
        # threads that load data and build a model, no step
        _THREADS + "def load(path):\n    return build_model(open(path).read())\n"
        "with ThreadPoolExecutor() as pool:\n    pool.map(load, ['a', 'b'])\n",
        # torch's RPC tests: a module's backward function, not a tensor's
        _THREADS + "import torch.distributed.autograd as dist_autograd\ndef work(ctx, loss):\n"
        "    dist_autograd.backward(ctx, [loss])\nthreading.Thread(target=work).start()\n",
        # processes, not threads
        "from concurrent.futures import ProcessPoolExecutor\ndef work(model, x):\n    model(x).sum().backward()\n"
        "with ProcessPoolExecutor() as pool:\n    pool.submit(work, None, 1)\n",
        # a step defined in the target but never called there
        _THREADS + "def work(model, x):\n    def later():\n        model(x)\n    return later\n"
        "threading.Thread(target=work).start()\n",
    ],
)
def test_threads_that_step_nothing_or_hold_a_lock_are_left_alone(source):
    assert _judged(source) == []


def test_a_raw_call_under_a_partial_of_torch_compile_is_compiled():
    source = (
        _FLEX + "from functools import partial\n@partial(torch.compile, fullgraph=True)\ndef attend(q):\n"
        "    return flex_attention(q, q, q)\n"
    )
    assert _judged(source) == []


# --- compiled regions as real code writes them, and raw calls made on purpose (issue 44) ---


def _kinds(files: dict[str, str]) -> dict[tuple[str, int], str]:
    """(file, line) -> call kind of every flex_attention call, the files judged as one project."""
    facts = []
    for name, source in files.items():
        found = file_facts(name, source)
        found.relative = name
        facts.append(found)
    project = Project.of(*facts)
    return {(f.path, call.line): call_kind(call, f, project).kind for f in facts for call in f.raw_calls}


_CALL = "def attend(q):\n    return flex_attention(q, q, q)\n"


@pytest.mark.parametrize(
    ("files", "kind"),
    [
        # modded-nanogpt's idiom: the name rebound at module level, after the function that calls it
        ({"m.py": _FLEX + _CALL + "flex_attention = torch.compile(flex_attention, dynamic=False)\n"}, "compiled"),
        # the same rebinding under a module-level `if` (a flag read at import)
        ({"m.py": _FLEX + "if True:\n    flex_attention = torch.compile(flex_attention)\n" + _CALL}, "compiled"),
        # a function handed to torch.compile in the same file, and in another (the launcher)
        ({"m.py": _FLEX + _CALL + "fast = torch.compile(attend)\n"}, "compiled"),
        (
            {"m.py": _FLEX + _CALL, "train.py": "import torch\nfrom m import attend\nstep = torch.compile(attend)\n"},
            "compiled",
        ),
        # a module's forward, the model compiled whole in the launcher: torch.compile(model), block.compile(),
        # aot_compile, torch.export
        *[
            (
                {
                    "m.py": _FLEX + "class Attn(torch.nn.Module):\n    def forward(self, q):\n"
                    "        return flex_attention(q, q, q)\n",
                    "train.py": launcher,
                },
                "compiled",
            )
            for launcher in (
                "import torch\nmodel = torch.compile(model)\n",
                "import torch\nfor block in model.layers:\n    block.compile()\n",
                "import torch\nfrom torch._inductor import aot_compile\npackage = aot_compile(model, args)\n",
                "import torch\nprogram = torch.export.export(model, (q,))\n",
            )
        ],
        # a module-level helper a module's method calls, the model compiled
        (
            {
                "m.py": _FLEX
                + _CALL
                + "class A(torch.nn.Module):\n    def forward(self, q):\n        return attend(q)\n"
                "model = torch.compile(A())\n"
            },
            "compiled",
        ),
        # a project's own compile decorator on the model's forward; the function registered as its attention
        (
            {
                "utils.py": "import torch\ndef maybe_compile(func=None, **kw):\n    if torch.cuda.is_available():\n"
                "        return torch.compile(func, **kw)\n    return func\n",
                "attn.py": _FLEX
                + "from transformers import AttentionInterface\n"
                + _CALL
                + "AttentionInterface.register('mine', attend)\n",
                "model.py": "from utils import maybe_compile\nclass Draft:\n    @maybe_compile\n"
                "    def forward(self, x):\n        return x\n",
            },
            "compiled",
        ),
        # on purpose: a test, a benchmark, an eager reference, a compile switch's eager side, beside the wrapper
        ({"tests/test_attn.py": _FLEX + _CALL}, "deliberate-raw"),
        ({"benchmarks/attn.py": _FLEX + _CALL}, "deliberate-raw"),
        ({"bench_flex.py": _FLEX + _CALL}, "deliberate-raw"),
        ({"m.py": _FLEX + "def eager_reference(q):\n    return flex_attention(q, q, q)\n"}, "deliberate-raw"),
        (
            {
                "m.py": _FLEX
                + "def attend(q, args):\n    if not args.compile:\n        return flex_attention(q, q, q)\n"
            },
            "deliberate-raw",
        ),
        (
            {
                "m.py": _FLEX + "fast = torch.compile(flex_attention)\ndef compare(q):\n"
                "    return fast(q, q, q), flex_attention(q, q, q)\n"
            },
            "deliberate-raw",
        ),
        # a risk: raw for short batches through a local alias (SpecForge's EAGLE3 attention)
        (
            {
                "m.py": _FLEX + "class A:\n    def forward(self, q, fast):\n        if q.shape[2] <= 128:\n"
                "            attend = flex_attention\n        else:\n            attend = fast\n"
                "        return attend(q, q, q)\n"
            },
            "risk",
        ),
        # a risk: nothing compiles it (a model compile elsewhere does not reach a plain function no module calls)
        ({"m.py": _FLEX + _CALL, "train.py": "import torch\nmodel = torch.compile(model)\n"}, "risk"),
        # disabled inside a compiled model is still raw
        (
            {
                "m.py": _FLEX + "class A(torch.nn.Module):\n    @torch.compiler.disable\n    def forward(self, q):\n"
                "        return flex_attention(q, q, q)\nmodel = torch.compile(A())\n"
            },
            "risk",
        ),
    ],
)
def test_each_spelling_of_a_compiled_region_and_of_a_raw_call_on_purpose(files, kind):
    kinds = _kinds(files)
    assert kinds and set(kinds.values()) == {kind}, kinds


def test_a_launcher_that_rebinds_another_files_wrapper_to_raw_flex_is_found_there():
    """torchtitan's wrapper class compiles in attention.py; the launcher's patch (the first place a
    user puts one) makes every call raw."""
    wrapper = _FLEX + "class FlexAttentionWrapper:\n    _compiled_flex_attn = torch.compile(flex_attention)\n"
    launcher = (
        "from torch.nn.attention.flex_attention import flex_attention\nimport attention\n"
        "attention.FlexAttentionWrapper._compiled_flex_attn = flex_attention\n"
    )
    facts = [file_facts("attention.py", wrapper), file_facts("train.py", launcher)]
    project = Project.of(*facts)
    found = [f for one in facts for f in judge_file(one, project)]
    assert [(f.code, f.where.file, f.where.line) for f in found] == [("lint-wrapper-rebound", "train.py", 3)]
    assert "attention.py:4" in found[0].title
    # a test's tearDown restoring the wrapper it saved is not a rebinding to raw
    restore = "import attention\nclass T:\n    def tearDown(self):\n"
    restore += "        attention.FlexAttentionWrapper._compiled_flex_attn = self.saved\n"
    assert judge_file(file_facts("restore.py", restore), project) == []
