"""Regenerate docs/screenshot.png: the explainer's head widget, drawn by headless Chromium.

    python scripts/screenshot.py                      # default model, repeated random tokens
    python scripts/screenshot.py --model minilm --probe text --out /tmp/minilm.png

Starts the app in this process on a free loopback port, opens the page at 1280 px in Debian's
Chromium (never a downloaded browser), picks the probe and the head type, and photographs the
widget. Nothing leaves the machine: any request that is not to the local server is an error.
"""

from __future__ import annotations

import argparse
import shutil
import socket
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def serve(model: str) -> tuple[str, object]:
    """The app with ``model`` loaded, on a free port; returns its URL and the uvicorn server."""
    import uvicorn

    from headlab.server import create_app

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(create_app(preload=(model,)), port=port, log_level="warning")
    )
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.05)
    return f"http://127.0.0.1:{port}", server


def shoot(url: str, args: argparse.Namespace) -> None:
    from playwright.sync_api import sync_playwright

    problems: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.on(
            "request", lambda r: r.url.startswith((url, "data:", "blob:")) or problems.append(r.url)
        )
        page.on("pageerror", lambda e: problems.append(str(e)))
        page.goto(url + "/")
        page.wait_for_selector("#heads-grid button", timeout=120_000)
        page.select_option("#heads-model", args.model)
        if args.probe != "text":
            with page.expect_response(lambda r: r.url.endswith("/api/heads"), timeout=120_000):
                page.select_option("#heads-probe", args.probe)
        page.select_option("#heads-type", args.type)
        page.wait_for_timeout(500)
        page.mouse.move(0, 0)
        page.locator(args.selector).screenshot(path=str(args.out))
        browser.close()
    if problems:
        sys.exit(f"the page did something it should not: {problems}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="default", help="a model name from `headlab models`")
    parser.add_argument("--probe", default="random-repeat", choices=["random-repeat", "text"])
    parser.add_argument("--type", default="induction", help="the head type to pick in the widget")
    parser.add_argument("--selector", default="#heads .widget-box", help="what to photograph")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "screenshot.png")
    args = parser.parse_args()
    if not Path(CHROMIUM).exists():
        sys.exit("Chromium is not installed (apt-get install chromium)")
    url, server = serve(args.model)
    try:
        shoot(url, args)
    finally:
        server.should_exit = True  # type: ignore[attr-defined]
    print(f"wrote {args.out} ({args.out.stat().st_size / 1024:.0f} KiB)")


if __name__ == "__main__":
    main()
