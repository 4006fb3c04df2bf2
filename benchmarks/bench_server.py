"""Server latency and page weight: starts `headlab serve` and measures it from outside.

- 1,000 POST /api/shapes at concurrency 20: p50 / p99 latency and errors (target p50 < 10 ms).
- 200 POST /api/attention on the default model (or the first available), 64 tokens, one at a
  time: p50 / p99 and errors (target p50 < 100 ms).
- When SmolLM2 is fetched (``headlab models --fetch smollm2``): POST /api/attention and
  POST /api/heads on it, 64 tokens, one at a time: p50 / p99 and errors (no target; reported).
- The page's total transfer on first load, static assets and API answers (target < 500 KB),
  measured in headless Chromium when it is installed, else by following the page's imports.

Usage: python benchmarks/bench_server.py [--shapes 1000] [--attention 200] [--smollm2 30]
[--port 0]
"""

from __future__ import annotations

import argparse
import asyncio
import re
import shutil
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx
import orjson

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(port: int) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "headlab.cli", "serve", "--port", str(port)]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/api/health", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.2)
    proc.kill()
    raise SystemExit("server did not start within 120 s")


async def _post(reader, writer, host: str, path: str, body: bytes) -> int:
    """One keep-alive HTTP/1.1 POST on an open connection; returns the status code."""
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    writer.write(head.encode() + body)
    await writer.drain()
    lines = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
    length = next(int(x.split(":")[1]) for x in lines if x.lower().startswith("content-length:"))
    await reader.readexactly(length)
    return int(lines[0].split()[1])


async def hammer(url: str, bodies: list[dict], concurrency: int) -> tuple[list[float], int, float]:
    """POST every body with at most `concurrency` in flight: (latencies in s, errors, wall s).

    A lean client (one keep-alive connection per worker, no JSON decoding), so that on a small
    machine the load generator takes as little CPU from the server as it can.
    """
    parsed = httpx.URL(url)
    host, port, path = parsed.host, parsed.port, parsed.raw_path.decode()
    queue: asyncio.Queue[bytes] = asyncio.Queue()
    for body in bodies:
        queue.put_nowait(orjson.dumps(body))
    latencies: list[float] = []
    errors = 0

    async def worker() -> None:
        nonlocal errors
        reader, writer = await asyncio.open_connection(host, port)
        while not queue.empty():
            payload = queue.get_nowait()
            t0 = time.perf_counter()
            try:
                ok = await _post(reader, writer, f"{host}:{port}", path, payload) == 200
            except (OSError, asyncio.IncompleteReadError, ValueError, StopIteration):
                ok = False
                reader, writer = await asyncio.open_connection(host, port)
            latencies.append(time.perf_counter() - t0)
            errors += not ok
        writer.close()

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return latencies, errors, time.perf_counter() - start


def measure(
    name: str, url: str, bodies: list[dict], concurrency: int, target_ms: float | None
) -> None:
    """The run the target is set for, at ``concurrency``, then the other level as a reference
    in the same run (one at a time beside a concurrent target, and 4 in flight beside a serial
    one), so the figure can be read against the machine's load at that moment."""
    # warm-up, not counted: the first calls pay one-off costs (imports, the first meta trace)
    asyncio.run(hammer(url, bodies[:concurrency] + bodies[:5], concurrency))
    latencies, errors, wall = asyncio.run(hammer(url, bodies, concurrency))
    p50, p99 = statistics.median(latencies) * 1e3, statistics.quantiles(latencies, n=100)[98] * 1e3
    other = 1 if concurrency > 1 else 4
    ref_lat, ref_err, ref_wall = asyncio.run(
        hammer(url, bodies[: max(20, len(bodies) // 5)], other)
    )
    ref = statistics.median(ref_lat) * 1e3
    if target_ms is None:
        verdict = "no target"
    else:
        met = "meets" if p50 < target_ms and errors == 0 else "MISSES"
        verdict = f"{met} target p50 < {target_ms:.0f} ms, 0 errors"
    print(
        f"{name}: {len(latencies)} requests at concurrency {concurrency}: p50 {p50:.1f} ms, "
        f"p99 {p99:.1f} ms, errors {errors}, {len(latencies) / wall:.1f} req/s "
        f"[{verdict}]; reference in the same run, "
        f"{len(ref_lat)} at concurrency {other}: p50 {ref:.1f} ms, {len(ref_lat) / ref_wall:.1f} "
        f"req/s, errors {ref_err}"
    )


def smollm2_routes(base: str, count: int) -> None:
    """/api/attention and /api/heads on SmolLM2 (30 layers × 9 heads) at 64 tokens."""
    text = text_of_tokens("smollm2", 64)
    bodies = [{"model": "smollm2", "text": text}] * count
    httpx.post(base + "/api/attention", json=bodies[0], timeout=300)  # load it once, not timed
    for route in ("attention", "heads"):
        measure(f"POST /api/{route} (smollm2, 64 tokens)", f"{base}/api/{route}", bodies, 1, None)


def text_of_tokens(model: str, n: int) -> str:
    """A text that the model's tokenizer turns into exactly (or just under) n tokens."""
    from headlab import zoo
    from headlab.measure import REPEAT_SENTENCE

    _, tokenizer = zoo.load(model)
    words = (REPEAT_SENTENCE + " ").split() * 8
    lo, hi = 1, len(words)
    while lo < hi:  # the most words that still fit
        mid = (lo + hi + 1) // 2
        if len(tokenizer.encode(" ".join(words[:mid]))) <= n:
            lo = mid
        else:
            hi = mid - 1
    return " ".join(words[:lo])


def page_weight(base: str) -> tuple[int, int, str]:
    """(static bytes, API bytes, how measured) for one first load of the page."""
    chromium = shutil.which("chromium")
    if chromium:
        from playwright.sync_api import sync_playwright

        sizes = {"static": 0, "api": 0}
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
            page = browser.new_page()

            def count(request) -> None:
                # bytes on the wire: headers plus the (gzip-encoded) body
                kind = "api" if "/api/" in request.url else "static"
                wire = request.sizes()
                sizes[kind] += wire["responseBodySize"] + wire["responseHeadersSize"]

            page.on("requestfinished", count)
            page.goto(base + "/")
            page.wait_for_selector("#heads-grid button", timeout=120_000)
            page.wait_for_timeout(500)
            browser.close()
        return sizes["static"], sizes["api"], "headless Chromium"
    seen: set[str] = set()
    todo = ["/"]
    total = 0
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        body = httpx.get(base + path).text
        total += len(body.encode())
        for ref in re.findall(r'(?:src|href)="(/static/[^"]+)"', body):
            todo.append(ref)
        for ref in re.findall(r'from "\./([^"]+)"', body):
            todo.append("/static/js/" + ref)
    return total, 0, "static assets only (no Chromium)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", type=int, default=1000)
    parser.add_argument("--attention", type=int, default=200)
    parser.add_argument("--smollm2", type=int, default=30, help="requests per SmolLM2 route")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    port = args.port or free_port()
    base = f"http://127.0.0.1:{port}"
    proc = start_server(port)
    try:
        models = httpx.get(base + "/api/models").json()
        available = [m["name"] for m in models if m["available"]]
        model = "default" if "default" in available else (available or [None])[0]
        shapes = [
            {"d_model": 512, "n_heads": 8, "seq_len": 10 + i % 50, "batch": 2}
            for i in range(args.shapes)
        ]
        measure("POST /api/shapes", base + "/api/shapes", shapes, 20, 10)
        if model is None:
            print("POST /api/attention: skipped, no model available")
        else:
            text = text_of_tokens(model, 64)
            answer = httpx.post(base + "/api/attention", json={"model": model, "text": text})
            n = len(answer.json()["ids"])
            bodies = [{"model": model, "text": text}] * args.attention
            measure(
                f"POST /api/attention ({model}, {n} tokens)",
                base + "/api/attention",
                bodies,
                1,
                100,
            )
        if "smollm2" in available and args.smollm2 > 0:
            smollm2_routes(base, args.smollm2)
        else:
            print("SmolLM2 routes: skipped, not fetched (headlab models --fetch smollm2)")
        static, api, how = page_weight(base)
        total = static + api
        verdict = "meets" if total < 500_000 else "MISSES"
        print(
            f"page transfer on first load: {total / 1000:.0f} KB ({static / 1000:.0f} KB page "
            f"assets + {api / 1000:.0f} KB API answers; {how})  ({verdict} target < 500 KB)"
        )
    finally:
        proc.terminate()
        proc.wait(timeout=10)


if __name__ == "__main__":
    main()
