"""Streamed load: calls read event by event as they arrive, each with its time to first answer event and the
arrival of every later one; cells of such calls from N clients in blocks the targets take turns at, with the
CPU the proxy, the upstream and the load generator spent on them.

A stream target says what its stream looks like: an OpenAI chat stream (CHAT), vLLM's token-in/token-out
/inference/v1/generate stream (GENERATE, its marks count token ids) or an Anthropic Messages stream (ANTHROPIC).
"""

from __future__ import annotations

import asyncio
import gc
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from benchkit.load import CpuMeter, cell_requests, percentile, split
from benchkit.targets import ANTHROPIC_BODY, ANTHROPIC_HEADERS, Service, Target

CHAT, GENERATE, ANTHROPIC = "chat", "generate", "anthropic"  # what a target's stream looks like
# Thinking off: the prompt closes the think block, so every sampled token (but the stop id) is answer text.
ANTHROPIC_STREAM = {**ANTHROPIC_BODY, "max_tokens": 4096, "stream": True, "thinking": {"type": "disabled"}}


@dataclass
class StreamTarget(Target):
    kind: str = CHAT  # CHAT | GENERATE | ANTHROPIC
    baseline: str | None = None  # the direct target whose stream this one translates

    def warm_body(self) -> dict[str, Any]:
        """The same call, not streamed: opens a connection without waiting for a paced stream."""
        return {k: v for k, v in self.body.items() if k not in ("stream", "stream_options")}


def anthropic_stream_target(name: str, proxy: Service, baseline: str) -> StreamTarget:
    """The streamed Anthropic Messages call (thinking off) through a proxy."""
    return StreamTarget(name, f"{proxy.base_url}/v1/messages", ANTHROPIC_STREAM, ANTHROPIC_HEADERS, proxy,
                        kind=ANTHROPIC, baseline=baseline)


@dataclass
class Call:
    """One streamed call as the client saw it (times in seconds from sending the request)."""

    ttft: float
    total: float
    marks: list[tuple[int, float]]  # per event with answer text: (text so far in chars | generate: ids so far, time)
    tokens: int  # sampled tokens, as the stream's usage says
    text: str  # the answer text (generate: "", its ids are in `ids`)
    ids: list[int]
    sent: float = 0.0  # wall clock, to line the call up with the upstream's and polar's own timestamps


class StreamError(Exception):
    pass


async def stream_call(session: aiohttp.ClientSession, target: StreamTarget) -> Call:
    """One streamed call, every event read as it arrives."""
    marks: list[tuple[int, float]] = []
    pieces: list[str] = []
    ids: list[int] = []
    size, tokens = 0, None
    sent, t0 = time.time(), time.perf_counter()
    async with session.post(target.url, json=target.body, headers=target.headers) as resp:
        if resp.status != 200:
            raise StreamError(f"HTTP {resp.status}: {(await resp.read())[:300]!r}")
        async for line in resp.content:
            if not line.startswith(b"data:"):
                continue
            now = time.perf_counter() - t0
            payload = line[5:].strip()
            if payload == b"[DONE]":
                continue
            event = json.loads(payload)
            if target.kind == ANTHROPIC:
                kind = event.get("type")
                if kind == "content_block_delta":
                    delta = event["delta"]
                    text = delta.get("text") or delta.get("thinking") or delta.get("partial_json") or ""
                    pieces.append(text)
                    size += len(text)
                    marks.append((size, now))
                elif kind == "message_delta":
                    tokens = (event.get("usage") or {}).get("output_tokens", tokens)
                elif kind == "error":
                    raise StreamError(f"error event: {event.get('error')}")
                continue
            if "error" in event:
                raise StreamError(f"error chunk: {event['error']}")
            if event.get("usage"):
                tokens = event["usage"].get("completion_tokens", tokens)
            for choice in event.get("choices") or []:
                new = choice.get("token_ids") or []
                text = (choice.get("delta") or {}).get("content") or ""
                if new or text:
                    ids += new
                    pieces.append(text)
                    size += len(text)
                    marks.append((len(ids) if target.kind == GENERATE else size, now))
    total = time.perf_counter() - t0
    if not marks:
        raise StreamError("the stream carried no answer")
    return Call(marks[0][1], total, marks, tokens if tokens is not None else len(ids), "".join(pieces), ids, sent)


async def first_call(target: StreamTarget) -> Call:
    """One streamed call on a connection of its own (a target's first: proves it answers, and what)."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
        try:
            return await stream_call(session, target)
        except (StreamError, aiohttp.ClientError, asyncio.TimeoutError) as exc:
            raise RuntimeError(f"{target.name}: {type(exc).__name__}: {exc}") from None


@dataclass
class StreamCell:
    """One target at one concurrency: its calls over every round."""

    target: StreamTarget
    clients: int
    calls: list[Call] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    wall: float = 0.0
    proxy_cpu: float | None = None  # seconds over the timed parts (None: no proxy)
    upstream_cpu: float = 0.0
    client_cpu: float = 0.0  # the load generator's (this process)

    def cpu_ms(self, seconds: float | None) -> float | None:
        return None if seconds is None or not self.calls else seconds * 1000 / len(self.calls)


async def run_block(cell: StreamCell, upstream: Service, n: int) -> None:
    """`n` streamed calls from `cell.clients` concurrent clients, one keep-alive connection each, opened by one
    untimed non-streamed call each."""
    target, clients = cell.target, cell.clients
    connector = aiohttp.TCPConnector(limit=clients)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=600)) as session:

        async def warm() -> None:
            async with session.post(target.url, json=target.warm_body(), headers=target.headers) as resp:
                await resp.read()
                if resp.status != 200:
                    raise RuntimeError(f"{target.name}: warm-up answered HTTP {resp.status}")

        await asyncio.gather(*(warm() for _ in range(clients)))
        todo = iter(range(n))

        async def client() -> None:
            for _ in todo:
                try:
                    cell.calls.append(await stream_call(session, target))
                except (StreamError, aiohttp.ClientError, asyncio.TimeoutError, ValueError, KeyError) as exc:
                    cell.errors.append(f"{type(exc).__name__}: {exc}")

        gc.collect()
        gc.freeze()  # what exists now is never scanned again: no long collector pauses in the timed part
        meter = CpuMeter(target.proxy, upstream)
        meter.start()
        t0 = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(clients)))
        cell.wall += time.perf_counter() - t0
        cpu = meter.used()
        cell.client_cpu += cpu["load"] or 0.0
        cell.upstream_cpu += cpu["upstream"] or 0.0
        if target.proxy:
            cell.proxy_cpu = (cell.proxy_cpu or 0.0) + (cpu["proxy"] or 0.0)


async def run_stream_matrix(targets: list[StreamTarget], upstream: Service, concurrency: list[int], requests: int,
                            rounds: int, progress: Callable[[str], None]) -> list[StreamCell]:
    """Every target at every concurrency, each cell's calls in `rounds` blocks the targets take turns at, a
    different one first each round."""
    cells = {(t.name, c): StreamCell(t, c) for c in concurrency for t in targets}
    for clients in concurrency:
        blocks = split(cell_requests(requests, clients), rounds)
        for r, n in enumerate(blocks):
            for target in targets[r % len(targets):] + targets[:r % len(targets)]:
                cell = cells[(target.name, clients)]
                done, errors = len(cell.calls), len(cell.errors)
                await run_block(cell, upstream, n)
                new = cell.calls[done:]
                progress(f"{clients:>3} clients  round {r + 1}/{len(blocks)}  {target.name:<21} {len(new):>4} calls  "
                         f"TTFT p50 {percentile([c.ttft for c in new], 50) * 1000:8.2f} ms  "
                         f"stream p50 {percentile([c.total for c in new], 50) * 1000:8.1f} ms  "
                         f"errors {len(cell.errors) - errors}")
    return list(cells.values())
