#!/usr/bin/env python3
"""Benchmark: latency and throughput polar adds over calling the upstream directly.

Both columns run in the same process against the same upstream (the scripted vLLM double, so
the upstream's own cost is small and stable), side by side, at each concurrency:
  direct  — OpenAI chat completion with token ids straight to the upstream (what polar sends it);
  polar   — the same conversation as an Anthropic Messages call through the polar proxy
            (detect, translate, upstream call, render, durable capture).
The upstream and the proxy run as separate processes; the load generator is this process.
On this 2-core machine all three share the CPU, so absolute numbers are pessimistic; the added
latency and the throughput ratio are the figures to read.

    python scripts/bench_proxy.py [--requests 300] [--concurrency 1 16 64] [--stream]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from rich.console import Console
from rich.table import Table

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from polar.proxy import free_port  # noqa: E402

MESSAGES = [{"role": "user", "content": "Say hello in one short sentence."}]


def wait_http(url: str, timeout: float = 60) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            httpx.get(url, timeout=1)
            return
        except httpx.HTTPError:
            time.sleep(0.1)
    raise RuntimeError(f"{url} did not come up")


async def run_load(url: str, body: dict, headers: dict, n: int, concurrency: int) -> tuple[list[float], float]:
    latencies: list[float] = []
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(limits=limits, timeout=60) as client:
        for _ in range(min(concurrency, 8)):  # warm connections and caches
            (await client.post(url, json=body, headers=headers)).raise_for_status()
        queue = iter(range(n))

        async def worker() -> None:
            for _ in queue:
                t = time.perf_counter()
                resp = await client.post(url, json=body, headers=headers)
                await resp.aread()
                resp.raise_for_status()
                latencies.append(time.perf_counter() - t)

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - t0
    return latencies, wall


def pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] * 1000 if len(values) > 1 else values[0] * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=300, help="requests per column and concurrency level")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64])
    ap.add_argument("--stream", action="store_true", help="ask polar for SSE (the upstream call is the same)")
    ap.add_argument("--sync", choices=["FULL", "NORMAL"], default="FULL",
                    help="capture commit mode (polar_db_sync; FULL is polar's default): NORMAL survives a crash of "
                         "polar but not of the machine, and saves the fsync per call")
    ap.add_argument("--tokenizer", default=str(Path(os.environ.get("POLAR_CACHE", Path.home() / ".cache/polar")) / "models/qwen35-tiny"))
    args = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="polar-bench-"))
    up_port, px_port = free_port(), free_port()
    polar = [sys.executable, "-m", "polar.cli"]
    procs = [
        subprocess.Popen([*polar, "double", "--tokenizer", args.tokenizer, "--port", str(up_port)]),
        subprocess.Popen([*polar, "proxy", "--upstream", f"http://127.0.0.1:{up_port}", "--port", str(px_port),
                          "--db", str(tmp / "captures.db"), "--set", f"polar_db_sync={args.sync}"],
                         stdout=subprocess.DEVNULL),
    ]
    try:
        wait_http(f"http://127.0.0.1:{up_port}/health")
        wait_http(f"http://127.0.0.1:{px_port}/")
        direct_body = {"model": "polar-tiny", "messages": MESSAGES, "max_tokens": 64,
                       "return_token_ids": True, "logprobs": True}
        polar_body = {"model": "claude-sonnet-4-5", "max_tokens": 64, "messages": MESSAGES, "stream": args.stream}
        table = Table(title=f"polar vs direct upstream ({args.requests} requests per cell, "
                            f"{'streamed' if args.stream else 'non-streamed'}, captures synchronous={args.sync}, "
                            f"{os.cpu_count()} cores shared)")
        for col in ("clients", "direct p50 ms", "polar p50 ms", "added p50 ms", "direct p99 ms", "polar p99 ms",
                    "added p99 ms", "direct req/s", "polar req/s", "throughput ratio"):
            table.add_column(col, justify="right")
        for c in args.concurrency:
            d_lat, d_wall = asyncio.run(run_load(f"http://127.0.0.1:{up_port}/v1/chat/completions", direct_body, {},
                                                 args.requests, c))
            p_lat, p_wall = asyncio.run(run_load(f"http://127.0.0.1:{px_port}/v1/messages", polar_body,
                                                 {"x-api-key": "bench", "anthropic-version": "2023-06-01"},
                                                 args.requests, c))
            d50, p50, d99, p99 = pct(d_lat, 50), pct(p_lat, 50), pct(d_lat, 99), pct(p_lat, 99)
            d_rps, p_rps = len(d_lat) / d_wall, len(p_lat) / p_wall
            table.add_row(str(c), f"{d50:.2f}", f"{p50:.2f}", f"{p50 - d50:.2f}", f"{d99:.2f}", f"{p99:.2f}",
                          f"{p99 - d99:.2f}", f"{d_rps:.0f}", f"{p_rps:.0f}", f"{p_rps / d_rps:.2f}")
        Console().print(table)
        Console().print("target: added p50 < 5 ms for a non-streamed call at concurrency 1")
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(timeout=30)


if __name__ == "__main__":
    main()
