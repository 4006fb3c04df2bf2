"""The live phase change as a reader sees it: press Train on the page, with the browser drawing
on the same machine as the server trains.

Starts ``headlab serve`` in its own process on a free loopback port, then for each round: opens
the page in Debian's headless Chromium, presses Train (seed 0 unless ``--seed``), waits for the
verdict, and reads the seconds the page reports to the end of the phase-change window (the
server's clock). It also runs the same request with no browser (the event stream read here and
thrown away), so the browser's share shows as the difference, and it reports Chromium's own CPU
seconds during each run.

Run: ``python benchmarks/bench_live_page.py [--rounds 3] [--seed 0]``
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from record import count

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
HEADLAB = Path(sys.executable).with_name("headlab")


def chromium_cpu() -> float:
    """CPU seconds (user + system) of every running Chromium process."""
    total, tick = 0.0, os.sysconf("SC_CLK_TCK")
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if b"chromium" not in Path(f"/proc/{pid}/cmdline").read_bytes():
                continue
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick
        except OSError:
            continue
    return total


def start_server() -> tuple[str, subprocess.Popen[bytes]]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [str(HEADLAB), "serve", "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            urllib.request.urlopen(url + "/api/live", timeout=1).read()
            return url, proc
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise SystemExit("headlab serve did not answer within 120 s")


def without_browser(url: str, seed: int) -> float:
    """Seconds to the window's end of one run streamed here, no browser."""
    body = json.dumps({"seed": seed, "n_layers": 2, "n_heads": 4}).encode()
    request = urllib.request.Request(
        url + "/api/live/induction", body, {"content-type": "application/json"}
    )
    event, seconds = "", None
    with urllib.request.urlopen(request, timeout=600) as stream:
        for raw in stream:
            line = raw.decode().strip()
            if line.startswith("event:"):
                event = line[6:].strip()
            elif line.startswith("data:") and event == "verdict":
                seconds = json.loads(line[5:])["phase_change_seconds"]
    if seconds is None:
        raise SystemExit("the run ended without a phase change")
    return float(seconds)


def with_browser(browser: object, url: str, seed: int) -> tuple[float, float]:
    """(seconds the page reports, Chromium CPU seconds during the run)."""
    page = browser.new_page(viewport={"width": 1280, "height": 900})  # type: ignore[attr-defined]
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(url + "/")
    page.wait_for_selector("#heads-view svg.heatmap", timeout=120_000)
    page.fill("#live-seed", str(seed))
    page.locator("#live-train").scroll_into_view_if_needed()
    page.wait_for_timeout(1000)
    cpu = chromium_cpu()
    page.click("#live-train")
    page.wait_for_selector("#live-verdict-text", timeout=600_000)
    cpu = chromium_cpu() - cpu
    match = re.search(r"over ([\d.]+) s after training started", page.inner_text("#live-phase"))
    page.close()
    if errors or not match:
        raise SystemExit(f"the page failed: {errors or 'no phase change reported'}")
    return float(match.group(1)), cpu


def main(argv: list[str] | None = None) -> int:
    from playwright.sync_api import sync_playwright

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=count(), default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    url, server = start_server()
    rows: dict[str, list[float]] = {"page": [], "stream": [], "chromium": []}
    try:
        without_browser(url, args.seed)  # the server's first run pays its warm-up
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
            for r in range(args.rounds):  # interleaved, so drift in the load hits both
                page_s, cpu = with_browser(browser, url, args.seed)
                stream_s = without_browser(url, args.seed)
                rows["page"].append(page_s)
                rows["chromium"].append(cpu)
                rows["stream"].append(stream_s)
                print(
                    f"round {r}: with the page drawing {page_s:.1f} s (Chromium {cpu:.1f} s "
                    f"of CPU); streamed, no browser {stream_s:.1f} s; load average "
                    f"{os.getloadavg()[0]:.2f}",
                    flush=True,
                )
            browser.close()
    finally:
        server.terminate()
        server.wait(timeout=30)
    med = {k: statistics.median(v) for k, v in rows.items()}
    print(
        f"medians: with the page {med['page']:.1f} s, no browser {med['stream']:.1f} s "
        f"(×{med['page'] / med['stream']:.2f}); Chromium {med['chromium']:.1f} s of CPU a run"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
