"""The static site's size and its first render: how long, in Debian's headless Chromium, from
opening the page to an interactive head viewer (the grid of heads, every label drawn), beside the
same page served by ``headlab serve`` (the reference), measured in the same run.

Builds the site (``headlab static``, or ``--site`` an existing one), serves it with a plain
``http.server`` and the explainer's app with uvicorn, both on loopback, and opens each page
``--rounds`` times in a fresh browser context (an empty cache, as a first visit). For the site,
the page's own marks (offline/offline-api.js: ``headlab:…``) and the resource timings say where
the time goes: the runtime's import, the model's session, the scoring's table and random-weights
models, the heads' answer. Medians; the machine's load is recorded.

Run: ``python benchmarks/bench_static.py [--rounds 5] [--site DIR]``
"""

from __future__ import annotations

import argparse
import functools
import http.server
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from record import count, machine, path_for, save

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"]
READY = "#heads-grid button[data-head]"  # the head viewer, drawn from the heads' answer
MARKS = ("offline-api", "runtime-imported", "model-ready", "scoring-ready", "weights", "scored")


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass


@contextmanager
def static_origin(site: Path) -> Iterator[str]:
    """``site`` served by Python's http.server on a free loopback port."""
    handler = functools.partial(_Quiet, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@contextmanager
def served_origin() -> Iterator[str]:
    """The explainer's app (the default model preloaded) on uvicorn in a thread."""
    import socket

    import uvicorn

    from headlab.server import create_app

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    srv = uvicorn.Server(
        uvicorn.Config(create_app(preload=("default",)), port=port, log_level="warning")
    )
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    while not srv.started:
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        srv.should_exit = True
        thread.join(timeout=30)


def first_render(browser: Any, origin: str) -> dict[str, Any]:
    """One first visit: seconds from navigation to the head viewer drawn, the page's marks
    (seconds from navigation) and the bytes and seconds of its largest downloads."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    start = time.perf_counter()
    page.goto(origin + "/")
    page.wait_for_selector(READY, timeout=120_000)
    seconds = time.perf_counter() - start
    marks = page.evaluate(
        """() => Object.fromEntries(performance.getEntriesByType("mark")
            .filter((m) => m.name.startsWith("headlab:"))
            .map((m) => [m.name.slice(8), m.startTime / 1000]))"""
    )
    resources = page.evaluate(
        """() => performance.getEntriesByType("resource").map((r) => ({
            name: r.name.split("/").pop(), start: r.startTime / 1000,
            end: r.responseEnd / 1000, bytes: r.encodedBodySize }))"""
    )
    context.close()
    big = sorted(resources, key=lambda r: -r["bytes"])[:6]
    return {"seconds": seconds, "marks": marks, "downloads": big}


def site_size(site: Path) -> dict[str, int]:
    """Bytes of the site: in all, and of its parts (runtime, models, word table, the rest)."""
    files = [p for p in site.rglob("*") if p.is_file()]
    part: Callable[[str], int] = lambda pattern: sum(p.stat().st_size for p in site.rglob(pattern))  # noqa: E731
    total = sum(p.stat().st_size for p in files)
    sizes = {
        "total": total,
        "files": len(files),
        "runtime": part("ort*"),
        "models": part("*.onnx"),
        "word_table": part("words-*"),
    }
    sizes["rest"] = total - sizes["runtime"] - sizes["models"] - sizes["word_table"]
    return sizes


def build(out: Path) -> None:
    cmd = [sys.executable, "-m", "headlab.cli", "static", str(out)]
    subprocess.run(cmd, check=True, capture_output=True, timeout=600)


def measure(site: Path, rounds: int) -> dict[str, Any]:
    """Alternating rounds of the static site and the served page (the reference)."""
    from playwright.sync_api import sync_playwright

    runs: dict[str, list[dict[str, Any]]] = {"static": [], "served": []}
    with static_origin(site) as static, served_origin() as served, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        first_render(browser, static)  # warm the OS file cache and Chromium's own start
        first_render(browser, served)
        for _ in range(rounds):
            runs["static"].append(first_render(browser, static))
            runs["served"].append(first_render(browser, served))
        browser.close()
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=count(), default=5)
    parser.add_argument("--site", type=Path, default=None, help="an existing site (else built)")
    parser.add_argument("--json", type=Path, default=path_for("static"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        site = args.site or Path(tmp) / "site"
        if args.site is None:
            build(site)
        sizes = site_size(site)
        load_before = machine()["load_average"]
        runs = measure(site, args.rounds)
    median = {k: statistics.median(r["seconds"] for r in v) for k, v in runs.items()}
    marks = {
        m: statistics.median(r["marks"].get(m, float("nan")) for r in runs["static"]) for m in MARKS
    }
    rows = [
        ["site size (MB)", f"{sizes['total'] / 1e6:.1f}"],
        ["of it: runtime (onnxruntime-web WASM)", f"{sizes['runtime'] / 1e6:.1f}"],
        ["of it: models (ONNX: trained + 3 random-weights)", f"{sizes['models'] / 1e6:.1f}"],
        ["of it: word table (wordfreq, English)", f"{sizes['word_table'] / 1e6:.1f}"],
        ["first render, static site (s, median)", f"{median['static']:.2f}"],
        ["first render, served page (s, median)", f"{median['served']:.2f}"],
        ["static / served", f"{median['static'] / median['served']:.2f}×"],
        *([f"page mark {m} (s, median)", f"{v:.2f}"] for m, v in marks.items()),
    ]
    ratio = median["static"] / median["served"]
    results = {
        "size_mb": round(sizes["total"] / 1e6, 1),
        "ratio": round(ratio, 2),
        "seconds": {k: round(v, 2) for k, v in median.items()},
        "sizes": sizes,
        "median_marks": marks,
        "runs": runs,
        "rounds": args.rounds,
        "load_before": load_before,
    }
    save(args.json, ["what", "value"], rows, results, load_after=machine()["load_average"])
    for row in rows:
        print(f"{row[0]:<48} {row[1]}")


if __name__ == "__main__":
    main()
