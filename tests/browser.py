"""A real headless Chromium for the HTML tests, driven by Playwright.

Where one comes from, in order: `DFLASHDOCTOR_CHROMIUM`; the binary `@sparticuz/chromium` unpacks to
/tmp/chromium (only if this user owns it and nobody else can write it: another local user's
/tmp/chromium would run as us); the system's `chromium`; else npm fetches `@sparticuz/chromium` into
a cache folder of this user's and unpacks it. None at all: the browser tests skip saying why, unless
`DFLASHDOCTOR_REQUIRE_BROWSER=1` (as `.ci/run` sets), when they fail.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

SPARTICUZ = "@sparticuz/chromium@153.0.0"
UNPACKED = Path("/tmp/chromium")
# flags that let @sparticuz/chromium (a headless shell) run as root in a container, off the network
SHELL_ARGS = ["--no-sandbox", "--no-zygote", "--single-process", "--headless=shell", "--disable-background-networking"]
# a full Chromium (Debian's): Playwright runs it headless itself
FULL_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update"]


def _ours(path: Path) -> bool:
    try:
        info = path.stat()
    except OSError:
        return False
    return info.st_uid == os.geteuid() and not info.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and os.access(path, os.X_OK)


def _from_npm() -> tuple[Path | None, str]:
    npm, node = shutil.which("npm"), shutil.which("node")
    if npm is None or node is None:
        return None, "no npm and node to fetch @sparticuz/chromium with"
    cache = Path.home() / ".cache" / "dflashdoctor-chromium"
    cache.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        [npm, "install", "--no-audit", "--no-fund", "--prefix", str(cache), SPARTICUZ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if done.returncode != 0:
        return None, f"npm install {SPARTICUZ} failed: {done.stderr.strip()[-200:]}"
    unpack = "import('@sparticuz/chromium').then(async m => console.log(await m.default.executablePath()))"
    done = subprocess.run([node, "-e", unpack], cwd=cache, capture_output=True, text=True, timeout=600, check=False)
    path = Path(done.stdout.strip() or UNPACKED)
    if done.returncode != 0 or not _ours(path):
        return None, f"{SPARTICUZ} did not unpack a browser: {done.stderr.strip()[-200:]}"
    return path, ""


def find_chromium() -> tuple[Path | None, str]:
    """A Chromium to launch, or None and why not."""
    named = os.environ.get("DFLASHDOCTOR_CHROMIUM")
    if named:
        return (
            (Path(named), "")
            if os.access(named, os.X_OK)
            else (None, f"DFLASHDOCTOR_CHROMIUM={named} is not executable")
        )
    if _ours(UNPACKED):
        return UNPACKED, ""
    system = shutil.which("chromium") or shutil.which("chromium-browser")
    if system:
        return Path(system), ""
    return _from_npm()


def need(reason: str) -> None:
    """Skip, or fail where a browser is required."""
    if os.environ.get("DFLASHDOCTOR_REQUIRE_BROWSER") == "1":
        pytest.fail(f"a browser test could not run: {reason}")
    pytest.skip(reason)


def launch_args(chromium: Path) -> list[str]:
    """The headless shell @sparticuz/chromium unpacks needs its own flags; a full Chromium its own."""
    return SHELL_ARGS if chromium == UNPACKED or "sparticuz" in str(chromium) else FULL_ARGS
