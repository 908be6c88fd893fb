#!/usr/bin/env python3
"""Benchmark: polar's upstream client (polar/upstream/h1.py) against aiohttp's, the one it replaced.

One process sends the small chat call polar sends upstream (benchkit.targets.DIRECT_BODY) to the scripted
upstream (scripts/bench_upstream.py), one call at a time over one keep-alive connection, with each client
in turn for --rounds rounds of --requests calls; reported per client: this process's CPU per call (user +
system, /proc) and the wall time per call, medians over the rounds, and the ratio to aiohttp's. The
upstream's own time is in the wall figure and the same for both.

    python scripts/bench_upstream_client.py [--requests 2000] [--rounds 5] [--markdown]
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchkit import args as cli  # noqa: E402
from benchkit.report import Run, table  # noqa: E402
from benchkit.targets import DIRECT_BODY, start_upstream, upstream_url  # noqa: E402

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
    ap = cli.parser(__doc__)
    ap.add_argument("--requests", type=int, default=2000, help="calls per client per round")
    ap.add_argument("--rounds", type=int, default=5)
    cli.tokenizer_arg(ap)
    cli.markdown_arg(ap)
    argv = list(sys.argv[1:] if argv is None else argv)
    args = ap.parse_args(argv)
    body = orjson.dumps(DIRECT_BODY)
    got: dict[str, list[tuple[float, float]]] = {name: [] for name in CLIENTS}
    with Run("bench_upstream_client.py", argv, width=200) as run:
        url = upstream_url(run.start(start_upstream(run.work, args.tokenizer)))
        for _ in range(args.rounds):
            for name, client in CLIENTS.items():
                got[name].append(asyncio.run(client(url, body, args.requests)))
    out = table(f"the upstream call, one at a time: {args.rounds} rounds x {args.requests} calls a client, clients "
                "taking turns", ("client", "CPU µs/call", "÷ aiohttp", "wall µs/call", "÷ aiohttp"), left=("client",))
    base_cpu, base_wall = (statistics.median(x[i] for x in got["aiohttp"]) for i in (0, 1))
    for name, rounds in got.items():
        cpu, wall = (statistics.median(x[i] for x in rounds) for i in (0, 1))
        out.add_row(name, f"{cpu:.0f}", f"{cpu / base_cpu:.2f}", f"{wall:.0f}", f"{wall / base_wall:.2f}")
    run.report(out, [], args.markdown)
    return got


if __name__ == "__main__":
    main()
