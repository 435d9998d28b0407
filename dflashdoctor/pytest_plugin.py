"""pytest plugin: dflashdoctor's expectations as markers, one option for a whole run, and a fixture.

Registered through the `pytest11` entry point, so it loads in every pytest run where dflashdoctor
is installed. Loading it imports pytest and the standard library only: torch (and dflashdoctor's
hooks) are imported when a test first asks for a check, so a project that uses none of this is
untouched.

- `@pytest.mark.flex_fused`: the test fails when flex_attention runs its dense kernel;
  `@pytest.mark.no_recompile_fallback`, `@pytest.mark.no_shared_autotuner` likewise.
- `--flex-fused`: `flex_fused` on every test of the run.
- `flex_recording`: the test's `dflashdoctor.testing.Recording`, to assert on the events yourself.
A failing check's finding is the test's failure message, and the summary counts the dense sites.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Generator
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from dflashdoctor.report import Finding
    from dflashdoctor.testing import Recording

# marker -> (the check in dflashdoctor.testing.expectations.CHECKS, what it means)
MARKERS = {
    "flex_fused": ("fused", "fail when flex_attention runs its dense kernel (forward or backward, any thread)"),
    "no_recompile_fallback": (
        "no-recompile-fallback",
        "fail when dynamo falls back to eager (the recompile limit hit, or a frame skipped after an exception)",
    ),
    "no_shared_autotuner": ("no-shared-autotuner", "fail when two threads are inside one triton autotuner at once"),
}
# Every watched test: its node id and the findings of the checks it asked for.
_WATCHED = pytest.StashKey[list[tuple[str, list["Finding"]]]]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("dflashdoctor")
    group.addoption(
        "--flex-fused",
        action="store_true",
        default=False,
        help="Mark every test flex_fused: a test in which flex_attention runs its dense kernel fails.",
    )


def pytest_configure(config: pytest.Config) -> None:
    for name, (_check, meaning) in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {meaning} (dflashdoctor)")
    config.stash[_WATCHED] = []


def _checks(item: pytest.Item) -> list[str]:
    checks = [check for name, (check, _) in MARKERS.items() if item.get_closest_marker(name)]
    if item.config.getoption("flex_fused", False) and "fused" not in checks:
        checks.insert(0, "fused")
    return checks


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, Any, Any]:
    checks = _checks(item)
    if not checks:
        return (yield)
    from dflashdoctor.testing import Recording
    from dflashdoctor.testing.expectations import CHECKS, failure

    recording = Recording(autotuners="no-shared-autotuner" in checks)
    try:
        with recording:
            result = yield
    finally:  # a test that raised is counted too; its own exception is what it reports
        block = recording.observations()
        item.config.stash[_WATCHED].append((item.nodeid, [f for check in checks for f in CHECKS[check][1](block)]))
    error = failure(recording, *checks)
    if error is not None:
        raise error
    return result


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, Any]:
    """A broken check fails the test with its finding as the whole message, not the plugin's traceback."""
    report = yield
    if call.when == "call" and call.excinfo is not None and _checks(item):
        from dflashdoctor.testing import ExpectationError

        if isinstance(call.excinfo.value, ExpectationError):
            report.longrepr = str(call.excinfo.value)
    return report


@pytest.fixture
def flex_recording() -> Generator[Recording, None, None]:
    """What the test has run so far: `flex_recording.dense_events`, `.fallbacks`,
    `.autotuner_overlaps` (watched where triton is installed), `.findings()`. It raises nothing."""
    from dflashdoctor.testing import record

    with record(autotuners=importlib.util.find_spec("triton") is not None) as recording:
        yield recording


def _site(finding: Finding) -> str:
    where = finding.where
    if where is None:
        return "an unrecorded call"
    return where.label() + (f" ({where.module})" if where.module else "")


def summary_lines(watched: list[tuple[str, list[Finding]]]) -> list[str]:
    """The run's tally: watched tests, the dense call sites with their kernel counts and the tests
    that reached them, and the other findings by code."""
    from dflashdoctor.judges.expectations import plural

    sites: dict[str, dict[str, Any]] = {}
    others: dict[str, int] = {}
    dense_tests = set()
    for nodeid, findings in watched:
        for f in findings:
            if f.code not in ("dense-forward", "dense-backward"):
                others[f.code] = others.get(f.code, 0) + 1
                continue
            dense_tests.add(nodeid)
            site = sites.setdefault(_site(f), {"forward": 0, "backward": 0, "tests": []})
            site[f.code.removeprefix("dense-")] += f.evidence.get("calls", 0)
            if nodeid not in site["tests"]:
                site["tests"].append(nodeid)
    lines = [
        f"{plural(len(watched), 'test')} watched; flex_attention ran its dense kernel in {len(dense_tests)} of "
        f"them, from {plural(len(sites), 'call site')}"
    ]
    for label, site in sites.items():
        tests = ", ".join(site["tests"][:3]) + (f" and {len(site['tests']) - 3} more" if len(site["tests"]) > 3 else "")
        lines.append(f"  {label}: forward {site['forward']}, backward {site['backward']} ({tests})")
    lines += [f"  {code}: {count}" for code, count in others.items()]
    return lines


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    watched = config.stash.get(_WATCHED, [])
    if not watched:
        return
    from dflashdoctor.safe_text import encodable, without_controls

    terminalreporter.write_sep("=", "dflashdoctor")
    for line in summary_lines(watched):
        terminalreporter.write_line(without_controls(encodable(line)))
