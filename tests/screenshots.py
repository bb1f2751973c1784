"""Pictures of the search page for the README and docs/service.md: ``jointspace serve`` on an index (``make
demo``'s: the sample photos and clips with the shipped model) in a subprocess, searched in headless Chromium at
1280 × 900 (desktop) and 390 × 844 (phone), light and dark, and a result opened in the detail view; the PNGs go to
``docs/screenshots/``. ``make screenshots`` builds the demo index when it is missing and runs this.

    python tests/screenshots.py --index demo/photos-index --out docs/screenshots
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from urllib.parse import quote

from browser import CHROMIUM_FLAGS, chromium, missing_browser         # beside this file: on sys.path when run
from server_process import spawn

QUERY = "a cat"                   # the demo gallery's cat photo and the moments of the clip made from it
SIZES = {"desktop": {"width": 1280, "height": 900}, "phone": {"width": 390, "height": 844}}
LOADED = """() => {
    const imgs = [...document.querySelectorAll(".hit img")];
    return document.querySelector("#results[aria-busy=false] .hit") && imgs.every((i) => i.complete && i.naturalWidth);
}"""

SHOWN = """() => {
    const image = document.getElementById("detail-image"), video = document.getElementById("detail-video");
    return (!image.hidden && image.complete && image.naturalWidth > 0) || (!video.hidden && video.readyState >= 2);
}"""


def shoot(url: str, out: Path, query: str = QUERY) -> list[Path]:
    """Writes ``{desktop,phone}-{light,dark}.png`` (the results of ``query``) and ``detail.png`` (its first result
    opened, desktop, light) into ``out``; returns their paths."""
    from playwright.sync_api import sync_playwright

    out.mkdir(parents=True, exist_ok=True)
    written = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium(), headless=True, args=CHROMIUM_FLAGS)
        for size, viewport in SIZES.items():
            for scheme in ("light", "dark"):
                page = browser.new_page(viewport=viewport, device_scale_factor=1, color_scheme=scheme,
                                        reduced_motion="reduce")
                page.goto(f"{url}/?q={quote(query)}")
                page.wait_for_function(LOADED, timeout=60_000)
                page.evaluate("document.activeElement.blur()")           # no focus ring, no caret
                written.append(out / f"{size}-{scheme}.png")
                page.screenshot(path=str(written[-1]))
                if size == "desktop" and scheme == "light":
                    page.locator(".hit").first.click()
                    page.wait_for_selector("#detail[open] #detail-captions[aria-busy=false] li", timeout=60_000)
                    page.wait_for_function(SHOWN, timeout=60_000)
                    written.append(out / "detail.png")
                    page.screenshot(path=str(written[-1]))
                page.close()
        browser.close()
    return written


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--index", required=True, help="the index to serve (make demo's: demo/photos-index)")
    parser.add_argument("--model", help="the model it was built with (default: the shipped model)")
    parser.add_argument("--out", default="docs/screenshots", help="folder for the PNGs (default docs/screenshots)")
    parser.add_argument("--query", default=QUERY, help=f"the search shown (default {QUERY!r})")
    args = parser.parse_args()
    reason = missing_browser()
    if reason is not None:
        print(f"screenshots: {reason}", file=sys.stderr)
        return 2
    proc, port = spawn(["--index", args.index, *(["--model", args.model] if args.model else [])], timeout=600)
    try:
        for path in shoot(f"http://127.0.0.1:{port}", Path(args.out), args.query):
            print(path)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
