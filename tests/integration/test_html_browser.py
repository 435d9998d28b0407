"""report.html in a real headless Chromium (Playwright): every committed example report, every
report the recordings hold, and reports this test has the CLI write. Each page loads without a
console error, shows every finding's code and title, draws every chart at a non-zero size, and every
link inside it reaches its target (a finding to its call-site row and the row back)."""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

import pytest

from dflashdoctor.causes import group
from dflashdoctor.commands.show import load_report
from dflashdoctor.render.html import render_html
from dflashdoctor.report import Report
from tests.browser import find_chromium, launch_args, need
from tests.conftest import run_cli
from tests.paths import ROOT, TARGETS

EXAMPLES = sorted((ROOT / "reports" / "examples").rglob("report.html"))
RECORDED = sorted((ROOT / "tests" / "assets" / "observations").rglob("*report.json"))


@pytest.fixture(scope="module")
def page():
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        need("playwright is not installed (pip install playwright)")
    chromium, why = find_chromium()
    if chromium is None:
        need(f"no Chromium could be had: {why}")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(chromium), args=launch_args(chromium))
        page = browser.new_page(viewport={"width": 1100, "height": 900})
        page.problems = []
        page.on("console", lambda m: page.problems.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: page.problems.append(str(e)))
        yield page
        browser.close()


CODE_SPAN = re.compile(r"`([^`\n]+)`")


def _plain(title: str) -> str:
    return CODE_SPAN.sub(r"\1", title)


def _expected_charts(report: Report) -> int:
    charts = sum(1 for r in report.results for c in r.comparisons if c.bars)
    # a plot is drawn where it measured something: marks, or a value that is not zero (no memory chart
    # of zeros for a CPU run)
    drawn = [
        p for r in report.results for p in r.plots if p.marks or any(y for line in p.lines for _, y in line.points)
    ]
    charts += len(drawn)
    return charts + (1 if report.command == "gate" and report.results else 0)


def _check(page, html: Path, report: Report) -> None:
    page.problems.clear()
    page.goto(html.as_uri())
    assert page.problems == [], (html, page.problems)
    headings = page.locator(".finding h3")
    shown = [headings.nth(i) for i in range(headings.count())]
    # each section's findings told once per cause, with how many places it has
    told = [cause for r in report.results for cause in group((r.probe, f) for f in r.findings)]
    # `code` spans are shown as code: the page's text has no backticks
    said = [f"{c.code} {_plain(c.title)}" + (f" ×{c.count}" if c.count > 1 else "") for c in told]
    assert [h.inner_text() for h in shown] == said, html
    assert all(h.is_visible() for h in shown), html
    charts = page.locator("svg.chart")
    assert charts.count() == _expected_charts(report), html
    for i in range(charts.count()):
        box = charts.nth(i).bounding_box()
        assert box is not None and box["width"] > 0 and box["height"] > 0, (html, i)
    broken = page.evaluate(
        """() => [...document.querySelectorAll('a[href^="#"]')]
            .map(a => a.getAttribute('href').slice(1)).filter(id => !document.getElementById(id))"""
    )
    assert broken == [], (html, broken)
    unanswered = page.evaluate(
        """() => [...document.querySelectorAll('.finding a[href^="#"]')].filter(a => {
            const row = document.getElementById(a.getAttribute('href').slice(1));
            const finding = a.closest('.finding');
            const ids = [finding.id, ...[...finding.querySelectorAll('span[id]')].map(s => s.id)];
            return !ids.some(id => row.querySelector(`a[href="#${id}"]`));
        }).map(a => a.closest('.finding').id)"""
    )
    assert unanswered == [], (html, unanswered)


@pytest.mark.parametrize("html", EXAMPLES, ids=[p.parent.name for p in EXAMPLES])
def test_every_committed_example_report(page, html):
    _check(page, html, load_report(html.with_name("report.json")))


def test_every_recorded_report(page, tmp_path):
    for path in RECORDED:
        report = load_report(path)
        html = tmp_path / f"{path.parent.name}-{path.name}.html"
        html.write_text(render_html(report), encoding="utf-8")
        _check(page, html, report)


def test_reports_the_cli_writes_now(page, tmp_path):
    """A run with optimizer steps (its per-step plots), a trace whose dense sites link to their rows,
    and a report holding markup, escape sequences and an undecodable byte in its strings."""
    runs = {
        "run": ("run", "--steps", "5", "--", sys.executable, str(TARGETS / "run" / "trains_forever.py")),
        "trace": ("trace-attention", "--drafter", "--drafter-fault", "eager-wrapper", "--device", "cpu"),
        "hostile": ("check-compile", f"{TARGETS / 'bad_inputs.py'}:raises_hostile", "--device", "cpu"),
    }
    for name, args in runs.items():
        folder = tmp_path / name
        folder.mkdir()
        done = run_cli(folder, *args)
        assert (done.report_dir / "report.html").is_file(), done.stderr[-2000:]
        report = load_report(done.report_dir / "report.json")
        _check(page, done.report_dir / "report.html", report)
        if name == "run":
            assert page.locator("figcaption", has_text="CUDA memory per step").count() == 0  # a CPU run
            assert page.locator("figcaption", has_text="step time").count() == 1
        if name == "trace":
            assert page.locator('.finding a[href^="#s0-t0-r"]').count() >= 5  # each dense layer to its row


def test_dark_mode_and_print(page, tmp_path):
    html = EXAMPLES[0]
    page.emulate_media(color_scheme="light")
    page.goto(html.as_uri())
    light = page.evaluate("getComputedStyle(document.body).backgroundColor")
    page.emulate_media(color_scheme="dark")
    dark = page.evaluate("getComputedStyle(document.body).backgroundColor")
    assert light != dark and dark == "rgb(23, 25, 28)"
    page.emulate_media(media="print", color_scheme="light")
    assert page.evaluate("getComputedStyle(document.querySelector('pre') || document.body).maxHeight") == "none"
    page.emulate_media(media="screen")
    if shutil.which("true"):  # a printable page: Chromium's own PDF of it is not empty
        pdf = tmp_path / "report.pdf"
        try:
            page.pdf(path=str(pdf))
        except Exception as exc:  # only headless-shell builds print; say which did not
            pytest.skip(f"this Chromium does not print to PDF: {exc}")
        assert pdf.stat().st_size > 1000


@pytest.mark.parametrize("width", [1280, 390])
def test_a_report_fits_a_laptop_and_a_phone_without_scrolling_sideways(page, width):
    """Charts scale to the page (viewBox, max-width), wide tables scroll in their own box, and the
    page itself never scrolls sideways; ticks are round numbers of their unit."""
    page.set_viewport_size({"width": width, "height": 900})
    for folder in ("h200-run-grows-until-oom", "h200-trace-drafter-eager-wrapper", "h200-raw-call"):
        page.goto((ROOT / "reports" / "examples" / folder / "report.html").as_uri())
        overflow = page.evaluate("() => document.documentElement.scrollWidth - window.innerWidth")
        assert overflow <= 0, (folder, width, overflow)
        charts = page.locator("svg.chart")
        for i in range(charts.count()):
            box = charts.nth(i).bounding_box()
            assert box is not None and box["x"] + box["width"] <= width, (folder, i, box)
    page.goto((ROOT / "reports" / "examples" / "h200-run-grows-until-oom" / "report.html").as_uri())
    ticks = page.evaluate(
        """() => [...document.querySelectorAll('svg.chart text[text-anchor="end"]')]
            .map(t => t.textContent).filter(t => t.endsWith('GiB'))"""
    )
    assert ticks and all(float(t.split()[0]) % 5 == 0 for t in ticks), ticks
