"""Screenshots of example reports for the docs, taken in the same headless Chromium as the browser
test (tests/browser.py says where it comes from), at a laptop's width (1280 px) and a phone's
(390 px, `-phone` in the name).

    python3 scripts/report_screenshots.py    # writes docs/screenshots/*.png
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.browser import find_chromium, launch_args  # noqa: E402

# example folder -> the part of its page worth showing (a CSS selector scrolled to the top)
SHOTS = {
    "h200-raw-call": "h1",
    "h200-trace-drafter-eager-wrapper": "h1",
    "h200-run-grows-until-oom": "h2:nth-of-type(2)",
}


WIDTHS = ((1280, ""), (390, "-phone"))


def main() -> None:
    from playwright.sync_api import sync_playwright

    chromium, why = find_chromium()
    if chromium is None:
        raise SystemExit(f"no Chromium: {why}")
    out = ROOT / "docs" / "screenshots"
    out.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(chromium), args=launch_args(chromium))
        page = browser.new_page()  # one page: the Chromium found may run as a single process
        for width, suffix in WIDTHS:
            page.set_viewport_size({"width": width, "height": 1000})
            for folder, selector in SHOTS.items():
                page.goto((ROOT / "reports" / "examples" / folder / "report.html").as_uri())
                page.locator(selector).first.scroll_into_view_if_needed()
                page.evaluate(f"document.querySelector({selector!r}).scrollIntoView()")
                page.screenshot(path=str(out / f"{folder}{suffix}.png"))
                print(out / f"{folder}{suffix}.png")
        browser.close()


if __name__ == "__main__":
    main()
