"""SmolLM2 in the static site against the same analysis through ``headlab serve``, in one run:
the download (in all and per file), the time from picking SmolLM2 in the head viewer to its
first head view (a first visit, an empty cache; and a second visit, read from the browser's
cache), and the per-text analysis time (POST /api/heads, every head scored and labelled by the
thresholds alone, as ``--no-floors``) at a few lengths up to the site's limit, in Debian's
headless Chromium; beside the memory the browser's renderer holds (its largest process's
resident set). Medians over ``--rounds``; ratios static / served; the machine's load recorded.
The served page loads SmolLM2 from headlab's cache on its first request, and its head viewer
labels with the floors there (kept on disk after their first run); the per-text analyses of
both leave the floors out, the same analysis.

Builds the site (``headlab static --model smollm2``, or ``--site`` an existing one).

Run: ``python benchmarks/bench_static_smollm2.py [--rounds 3] [--site DIR]``
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_static import CHROMIUM, FLAGS, READY, served_origin, static_origin
from record import count, machine, path_for, save

HEADS = 270  # SmolLM2's 30 layers × 9 query heads, each a button of the grid
WORDS = "the heron drifted over the marsh at dawn , and 19 quiet herons followed it home ;"


def text_of(tokens: int, tokenizer: Any) -> str:
    """A text of about ``tokens`` tokens (at most that many) from :data:`WORDS`, repeated."""
    words = (WORDS.split() * (tokens // 4 + 2))[: tokens * 2]
    while len(tokenizer.encode(" ".join(words))) > tokens:
        words.pop()
    return " ".join(words)


def renderer_mb() -> float:
    """Resident megabytes of Chromium's largest renderer process (the page's, with the WASM
    heap): the memory a reader's tab holds."""
    import psutil

    sizes = []
    for p in psutil.process_iter(["cmdline", "memory_info"]):
        cmd = p.info["cmdline"] or []
        if any("--type=renderer" in c for c in cmd) and p.info["memory_info"]:
            sizes.append(p.info["memory_info"].rss)
    return max(sizes, default=0) / 1e6


def first_view(page: Any) -> float:
    """Seconds from picking SmolLM2 in the model menu to its grid of heads drawn."""
    start = time.perf_counter()
    page.select_option("#heads-model", "smollm2")
    page.wait_for_function(
        f"() => document.querySelectorAll('{READY}').length === {HEADS}", timeout=900_000
    )
    return time.perf_counter() - start


def posted(page: Any, route: str, body: dict[str, Any]) -> float:
    """Seconds of one POST /api/``route`` with ``body``, its answer read, timed in the page."""
    ms = page.evaluate(
        """async ([route, body]) => { const t = performance.now();
            const r = await fetch(`/api/${route}`, { method: "POST", body,
                headers: { "content-type": "application/json" } });
            if (!r.ok) throw new Error((await r.json()).detail);
            await r.json(); return performance.now() - t; }""",
        [route, json.dumps(body)],
    )
    return float(ms) / 1000


def analysis(page: Any, text: str) -> float:
    """Seconds of one POST /api/heads on SmolLM2 (thresholds alone), timed in the page."""
    body = {"model": "smollm2", "text": text, "probe": "text", "floors": False}
    return posted(page, "heads", body)


# the heads the switch-off timings switch off (by their mean): SmolLM2's previous-token head
# 16.0, which feeds its induction heads, and one head of the first and last layers
SWITCHED = [[0, 3], [16, 0], [29, 8]]


def switching(page: Any, text: str) -> float:
    """Seconds of one POST /api/switch-off on SmolLM2 (the text run intact and with
    :data:`SWITCHED` off), timed in the page."""
    body = {"model": "smollm2", "text": text, "probe": "text", "off": SWITCHED}
    return posted(page, "switch-off", body)


def visit(
    browser: Any, origin: str, texts: dict[int, str], switched: dict[int, str], rounds: int
) -> dict[str, Any]:
    """A first visit (fresh context), the per-text analyses (``texts``), the switch-off runs
    (``switched``), then a second visit (a reload, the same context's cache)."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.goto(origin + "/")
    page.wait_for_selector(READY, timeout=120_000)
    out: dict[str, Any] = {"first_view": first_view(page), "analysis": {}, "memory_mb": {}}
    for n, text in texts.items():
        analysis(page, text)  # the first run at a length sizes the runtime's buffers
        out["analysis"][n] = statistics.median(analysis(page, text) for _ in range(rounds))
        out["memory_mb"][n] = renderer_mb()
    # the first switch-off fetches its graph (static) and loads it: timed alone
    out["first_switch_off"] = switching(page, switched[min(switched)])
    out["switch_off"] = {}
    for n, text in switched.items():
        switching(page, text)
        out["switch_off"][n] = statistics.median(switching(page, text) for _ in range(rounds))
    out["memory_mb"]["switch_off"] = renderer_mb()
    page.reload()
    page.wait_for_selector(READY, timeout=120_000)
    out["second_view"] = first_view(page)
    context.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=count(), default=3)
    parser.add_argument("--site", type=Path, default=None, help="an existing site (else built)")
    parser.add_argument("--json", type=Path, default=path_for("static_smollm2"))
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    from headlab import site_smollm2, zoo

    _, tokenizer = zoo.load("smollm2")
    lengths = (16, 64, site_smollm2.SITE_LEN)
    texts = {n: text_of(n, tokenizer) for n in lengths}
    # the server caps a switch-off text so that both runs' patterns fit its answer (121 tokens
    # of SmolLM2): the switch-off timings stop there, on both sides
    from headlab.server.schemas import SWITCH_RUNS, token_limits

    cap = token_limits(SWITCH_RUNS)["smollm2"]
    switch_lengths = sorted({min(n, cap) for n in lengths})
    switched = {n: text_of(n, tokenizer) for n in switch_lengths}
    load_before = machine()["load_average"]
    with tempfile.TemporaryDirectory() as tmp:
        site = args.site or Path(tmp) / "site"
        if args.site is None:
            cmd = [sys.executable, "-m", "headlab.cli", "static", str(site), "--model", "smollm2"]
            subprocess.run(cmd, check=True, capture_output=True, timeout=1800)
        config = json.loads((site / "static/offline/smollm2/config.json").read_text())
        with static_origin(site) as static, served_origin() as served, sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
            runs = {
                "static": visit(browser, static, texts, switched, args.rounds),
                "served": visit(browser, served, texts, switched, args.rounds),
            }
            browser.close()
    files = {f["name"]: f["bytes"] for f in config["files"]}
    total = sum(files.values())
    switch = config["switch"]
    s, v = runs["static"], runs["served"]
    rows = [
        ["download, SmolLM2 (MB)", f"{total / 1e6:.1f}"],
        *([f"file {name} (MB)", f"{size / 1e6:.1f}"] for name, size in files.items()),
        [f"file {switch['graph']}, on the first switch-off (MB)", f"{switch['bytes'] / 1e6:.1f}"],
        ["first head view, static, empty cache (s)", f"{s['first_view']:.1f}"],
        ["first head view, static, from the cache (s)", f"{s['second_view']:.1f}"],
        ["first head view, served, SmolLM2 read from disk (s)", f"{v['first_view']:.1f}"],
        ["first head view, served, second visit (s)", f"{v['second_view']:.1f}"],
    ]
    for n in lengths:
        ratio = s["analysis"][n] / v["analysis"][n]
        rows.append(
            [
                f"analysis at {n} tokens, static / served (s)",
                f"{s['analysis'][n]:.2f} / {v['analysis'][n]:.2f} ({ratio:.1f}×)",
            ]
        )
        rows.append([f"renderer memory after {n} tokens, static (MB)", f"{s['memory_mb'][n]:.0f}"])
    first = f"{s['first_switch_off']:.2f} / {v['first_switch_off']:.2f}"
    rows.append(["first switch-off, graph fetched, static / served (s)", first])
    for n in switch_lengths:
        a, b = s["switch_off"][n], v["switch_off"][n]
        said = f"{a:.2f} / {b:.2f} ({a / b:.1f}×)"
        rows.append([f"switch-off at {n} tokens, static / served (s)", said])
    memory = s["memory_mb"]["switch_off"]
    rows.append(["renderer memory after the switch-offs, static (MB)", f"{memory:.0f}"])
    results = {
        "files": files,
        "switch_graph": switch,
        "total_bytes": total,
        "runs": runs,
        "rounds": args.rounds,
        "load_before": load_before,
    }
    save(args.json, ["what", "value"], rows, results, load_after=machine()["load_average"])
    for row in rows:
        print(f"{row[0]:<52} {row[1]}")


if __name__ == "__main__":
    main()
