"""Property tests (Hypothesis, fixed seed) of what users type: the gate configuration parser and every
command's numeric options. Any value, of any type (nan, infinity, negative, huge, text, lists), is
either accepted inside its documented range or refused as bad input: never an exception of another
kind, and never a check or a budget silently switched off. And the source files lint and init parse:
any bytes under any coding cookie are read or refused as a syntax error."""

from __future__ import annotations

import contextlib
import encodings.aliases
import math
import tempfile
from pathlib import Path

import pytest
import typer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dflashdoctor import cli_options
from dflashdoctor.commands import check_compile, race, trace_attention
from dflashdoctor.errors import BadInput
from dflashdoctor.gate.config import GateConfig
from dflashdoctor.gate.config_file import load_config
from dflashdoctor.limits import MAX_SECONDS, MAX_STEPS, MAX_TRIALS, MAX_VARY
from dflashdoctor.lint.facts import file_facts, thread_facts
from dflashdoctor.shapes import MAX_SIZE

FUZZ = settings(max_examples=300, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])

numbers = st.one_of(
    st.integers(min_value=-(10**30), max_value=10**30),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0, 1, -1, 2**31 - 1, 2**31, 2**63, float("nan"), float("inf"), -0.0, 1e308]),
)
scalars = st.one_of(numbers, st.booleans(), st.text(alphabet=st.characters(codec="ascii"), max_size=12))
values = st.one_of(scalars, st.lists(scalars, max_size=3))
keys = st.sampled_from(
    [
        "timeout",
        "max_compile_seconds",
        "vary",
        "max_recompiles",
        "max_graph_breaks",
        "device",
        "mask",
        "target",
        "expect_wrapper",
        "probes",
        "parallel",
        "require_fused_backward",
        "threaded_autotuners",
        "model",
        "triton_dir",
        "no_such_key",
    ]
)


def _whole(value: object, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def _toml_value(value: object) -> str:
    """TOML for a scalar or a list of scalars (nan and inf are TOML floats)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


def _checked(config: GateConfig) -> None:
    """What an accepted configuration must satisfy: nothing silently off, everything in range."""
    assert all(math.isfinite(o.timeout_s) and o.timeout_s > 0 for o in config.options().values())
    budgets = config.budgets
    assert budgets.max_compile_seconds is None or (
        math.isfinite(budgets.max_compile_seconds) and budgets.max_compile_seconds >= 0
    )
    assert 0 <= config.check_compile.vary <= MAX_VARY
    assert 0 <= budgets.max_recompiles <= MAX_SIZE and 0 <= budgets.max_graph_breaks <= MAX_SIZE
    assert config.probes and ":" in config.check_compile.target


def _parsed(text: str) -> GateConfig | None:
    """The configuration `text` gives, or None when it is refused (as one line of bad input)."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder, "dflashdoctor.toml")
        path.write_text(text, encoding="utf-8")
        try:
            return load_config(path, Path(folder))[0]
        except BadInput as exc:
            assert "\n" not in str(exc)
            return None


def test_gate_configuration_parser():
    @FUZZ
    @given(st.dictionaries(keys, values, max_size=5), st.dictionaries(st.sampled_from(["batch", "q_len"]), values))
    def parse(table, shape):
        text = "".join(f"{key} = {_toml_value(value)}\n" for key, value in table.items())
        if shape:
            text += "[shape]\n" + "".join(f"{key} = {_toml_value(value)}\n" for key, value in shape.items())
        config = _parsed(text)
        if config is not None:
            _checked(config)

    parse()


def test_gate_configuration_numbers():
    """Only the numeric settings, so that most examples reach the range checks."""
    numeric = ["timeout", "max_compile_seconds", "vary", "max_recompiles", "max_graph_breaks"]

    @FUZZ
    @given(st.dictionaries(st.sampled_from(numeric), numbers, min_size=1, max_size=3))
    def parse(table):
        config = _parsed("".join(f"{key} = {_toml_value(value)}\n" for key, value in table.items()))
        if config is not None:
            _checked(config)

    parse()


def test_gate_configuration_as_bytes():
    @FUZZ
    @given(st.binary(max_size=40))
    def parse(raw):
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder, "dflashdoctor.toml")
            path.write_bytes(raw)
            try:
                config, _ = load_config(path, Path(folder))
            except BadInput:
                return
        _checked(config)

    parse()


def test_numeric_options_of_every_probing_command():
    @FUZZ
    @given(numbers, numbers, numbers)
    def options(first, second, third):
        attempts = [
            (
                lambda: check_compile.validate(
                    check_compile.CheckCompileOptions(
                        device="cpu", shape={"batch": first, "q_len": 256, "kv_len": 1280}, vary=second
                    )
                ),
                lambda: _whole(first, 1, MAX_SIZE) and _whole(second, 0, MAX_VARY),
            ),
            (
                lambda: check_compile.validate(check_compile.CheckCompileOptions(max_recompiles=third)),
                lambda: _whole(third, 0, MAX_SIZE),
            ),
            (
                lambda: trace_attention.validate(trace_attention.TraceAttentionOptions(steps=first, seq_len=second)),
                lambda: (
                    isinstance(first, int)
                    and 1 <= first <= MAX_STEPS
                    and isinstance(second, int)
                    and 1 <= second <= MAX_SIZE
                ),
            ),
            (
                lambda: race.validate(race.RaceOptions(threads=2, trials=first, processes=0)),
                lambda: _whole(first, 0, MAX_TRIALS),
            ),
        ]
        for attempt, in_range in attempts:
            try:
                attempt()
            except BadInput:
                assert not in_range()
                continue
            assert in_range()

    options()


@pytest.mark.parametrize("zero_means", [None, "turns the watchdog off"])
def test_seconds_options(zero_means):
    """--timeout, --hang-timeout and --wait: finite, and 0 only where it means something."""
    check = cli_options.seconds(zero_means)

    @FUZZ
    @given(st.floats(allow_nan=True, allow_infinity=True) | st.integers(-(10**20), 10**20))
    def seconds(value):
        try:
            assert check(value) == value
        except typer.BadParameter:
            too_long = math.isfinite(value) and value > MAX_SECONDS
            assert not math.isfinite(value) or value < 0 or (value == 0 and zero_means is None) or too_long
            return
        assert math.isfinite(value) and (value > 0 or (value == 0 and zero_means)) and value <= MAX_SECONDS

    seconds()


# every codec name Python knows, and some it does not: what a coding cookie may name
CODECS = sorted(set(encodings.aliases.aliases) | set(encodings.aliases.aliases.values()) | {"no-such", "mbcs"})


def test_any_source_bytes_under_any_cookie_are_read_or_a_syntax_error():
    """What lint and init catch for a file they cannot parse (SyntaxError; ValueError and
    RecursionError as well) is all a file's bytes can raise: not a LookupError from a cookie naming
    a codec that does not make text (`hex`), a UnicodeError from one that fails, or MemoryError."""

    @FUZZ
    @given(
        st.sampled_from([None, *CODECS]),
        st.booleans(),
        st.binary(max_size=60) | st.sampled_from([b"x = 1\n", b"flex_attention(q, k, v)\n", b"\xff\xfe\x00"]),
    )
    def read(codec, mark, body):
        data = (b"\xef\xbb\xbf" if mark else b"") + (f"# coding: {codec}\n".encode() if codec else b"") + body
        for facts in (file_facts, thread_facts):
            with contextlib.suppress(SyntaxError, ValueError, RecursionError):
                facts("fuzzed.py", data)

    read()
