"""Debian's Chromium driven by Playwright's Python package (its own browser download is never used): where the
browser is, the flags it runs with, and why it cannot run here — for the browser tests (tests/test_web.py) and the
screenshots of the search page (tests/screenshots.py)."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--disable-quic", "--no-first-run"]


def chromium() -> str | None:
    """``JOINTSPACE_CHROMIUM``, else Debian's /usr/bin/chromium, else a chromium on the PATH."""
    given = os.environ.get("JOINTSPACE_CHROMIUM")
    if given:
        return given
    if Path("/usr/bin/chromium").is_file():
        return "/usr/bin/chromium"
    return shutil.which("chromium") or shutil.which("chromium-browser")


def missing_browser() -> str | None:
    """Why the browser cannot run here, or None."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "the Python package 'playwright' is not installed (it is in the dev extra: pip install -e '.[dev]')"
    path = chromium()
    if path is not None and not Path(path).is_file():
        return f"JOINTSPACE_CHROMIUM={path} is not a file"
    if path is None:
        return ("Chromium is not installed (Debian: apt-get install chromium chromium-driver, which `make test` "
                "runs as root; or set JOINTSPACE_CHROMIUM to a Chromium binary)")
    return None


def require_browser() -> None:
    """Skips the calling browser test, loudly, when the browser cannot run here; fails it under CI (``CI`` set),
    which must run the browser tests."""
    import pytest

    reason = missing_browser()
    if reason is not None:
        message = f"BROWSER TESTS NOT RUN: {reason}"
        if os.environ.get("CI"):
            pytest.fail(message + " — CI must run them", pytrace=False)
        pytest.skip(message)
