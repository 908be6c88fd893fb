#!/usr/bin/env python3
"""Benchmark: polar's upstream client (polar/upstream/h1.py) against aiohttp's, the one it replaced.

One process sends the small chat call polar sends upstream (bench_proxy's DIRECT_BODY) to the scripted
upstream (scripts/bench_upstream.py), one call at a time over one keep-alive connection, with each client
in turn for --rounds rounds of --requests calls; reported per client: this process's CPU per call (user +
system, /proc) and the wall time per call, medians over the rounds, and the ratio to aiohttp's. The
upstream's own time is in the wall figure and the same for both.

    python scripts/bench_upstream_client.py [--requests 2000] [--rounds 5] [--markdown]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
import orjson
from rich import box
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_proxy as core  # noqa: E402

from polar.upstream.h1 import Pool  # noqa: E402

Send = Callable[[], Awaitable[bytes]]


async def timed(send: Send, requests: int) -> tuple[float, float]:
    """(CPU µs, wall µs) per call over `requests` calls, after a warm-up."""
    for _ in range(50):
        await send()
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(requests):
        await send()
    return (time.process_time() - cpu) / requests * 1e6, (time.perf_counter() - wall) / requests * 1e6


async def with_h1(url: str, body: bytes, requests: int) -> tuple[float, float]:
    pool = Pool(url)

    async def send() -> bytes:
        status, data = await pool.fetch("POST", "/v1/chat/completions", body, 600)
        assert status == 200, data[:200]
        return data

    try:
        return await timed(send, requests)
    finally:
        await pool.close()


async def with_aiohttp(url: str, body: bytes, requests: int) -> tuple[float, float]:
    # As polar used it: one session, a pooled connector, the body as bytes with its content type.
    connector = aiohttp.TCPConnector(limit=1024, ttl_dns_cache=300, keepalive_timeout=3)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=600)) as session:

        async def send() -> bytes:
            async with session.post(url + "/v1/chat/completions", data=body,
                                    headers={"content-type": "application/json"}) as resp:
                data = await resp.read()
                assert resp.status == 200, data[:200]
                return data

        return await timed(send, requests)


CLIENTS = {"polar h1": with_h1, "aiohttp": with_aiohttp}


def main(argv: list[str] | None = None) -> dict[str, list[tuple[float, float]]]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=2000, help="calls per client per round")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--tokenizer", default=str(core.DEFAULT_TOKENIZER))
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args(argv)
    body = orjson.dumps(core.DIRECT_BODY)
    got: dict[str, list[tuple[float, float]]] = {name: [] for name in CLIENTS}
    with tempfile.TemporaryDirectory(prefix="polar-bench-client-") as tmp:
        upstream = core.start_upstream(Path(tmp), args.tokenizer)
        try:
            url = core.upstream_url(upstream)
            for _ in range(args.rounds):
                for name, run in CLIENTS.items():
                    got[name].append(asyncio.run(run(url, body, args.requests)))
        finally:
            upstream.stop()
    table = Table(title=f"the upstream call, one at a time: {args.rounds} rounds x {args.requests} calls a client, "
                        "clients taking turns", box=box.MARKDOWN if args.markdown else box.SIMPLE)
    for col in ("client", "CPU µs/call", "÷ aiohttp", "wall µs/call", "÷ aiohttp"):
        table.add_column(col, justify="left" if col == "client" else "right")
    base_cpu, base_wall = (statistics.median(x[i] for x in got["aiohttp"]) for i in (0, 1))
    for name, rounds in got.items():
        cpu, wall = (statistics.median(x[i] for x in rounds) for i in (0, 1))
        table.add_row(name, f"{cpu:.0f}", f"{cpu / base_cpu:.2f}", f"{wall:.0f}", f"{wall / base_wall:.2f}")
    console = Console(width=200)
    console.print(table)
    console.print(f"command: python scripts/bench_upstream_client.py {' '.join(argv if argv is not None else sys.argv[1:])}")
    return got


if __name__ == "__main__":
    main()
