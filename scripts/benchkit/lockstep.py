"""Replayed load: recorded CLI sessions (benchkit/replay.py) growing turn by turn against a target, every session
of a target taking turn t before any takes t + 1, in turn buckets; a bucket's CPU (the proxy process and its
children, between the bucket's ends; py-spy's samples with a profile dir) is spent only on calls of its turns.

A target takes a CLI's request on its own route for that format: polar on the CLI's path as recorded, LiteLLM
on its route for the format, direct (the upstream itself) only in OpenAI Chat, the format it speaks.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from benchkit.load import CpuMeter, percentile
from benchkit.profile import Profile, Profiler
from benchkit.replay import AUTH, Fixture, Session
from benchkit.targets import DIRECT_BODY, Service

# LiteLLM's own route for each format (polar answers the CLI's path as recorded).
LITELLM_PATHS = {"anthropic": "/v1/messages", "openai_chat": "/v1/chat/completions", "openai_responses": "/v1/responses"}


@dataclass
class ReplayTarget:
    """One proxy (or the upstream itself) for one CLI's format."""

    name: str  # direct | polar... | litellm
    base: str  # root URL
    proxy: Service | None

    @property
    def db(self) -> Path | None:
        """polar's capture database."""
        return self.proxy.db if self.proxy else None

    def url(self, fixture: Fixture, path: str) -> str:
        if self.name == "direct":
            return f"{self.base}/v1/chat/completions"
        if self.name == "litellm" and fixture.provider in LITELLM_PATHS:
            return self.base + LITELLM_PATHS[fixture.provider] + ("?beta=true" if "beta=true" in path else "")
        return self.base + path  # polar: the CLI's own path; LiteLLM's Gemini routes are Google's paths

    def body(self, raw: bytes) -> bytes:
        if self.name != "direct":
            return raw
        body = json.loads(raw)  # what polar and LiteLLM send the upstream: its model name, ids and logprobs
        body.update(model=DIRECT_BODY["model"], return_token_ids=True, logprobs=True)
        return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()


def takes_format(target: str, provider: str) -> bool:
    """Whether a target can take that provider's format at all (direct: only the upstream's own)."""
    return target != "direct" or provider == "openai_chat"


@dataclass
class Bucket:
    """One target's calls over a range of turns."""

    first: int
    last: int
    calls: int = 0
    cpu: float | None = None  # proxy seconds over the bucket
    wall: float = 0.0
    profile: Profile | None = None  # py-spy's samples of the proxy over the bucket (with a profile dir)

    @property
    def cpu_ms(self) -> float | None:
        return None if self.cpu is None or not self.calls else self.cpu * 1000 / self.calls


@dataclass
class Replay:
    """One target for one CLI, streamed or not: its sessions, buckets, latencies and what went wrong."""

    cli: str
    api: str
    stream: bool
    target: ReplayTarget
    sessions: list[Session]
    buckets: list[Bucket] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def calls(self) -> int:
        return sum(b.calls for b in self.buckets)

    @property
    def cpu_ms(self) -> float | None:
        cpu = [b.cpu for b in self.buckets if b.cpu is not None]
        return cpu and self.calls and sum(cpu) * 1000 / self.calls or None

    @property
    def rate(self) -> float:
        wall = sum(b.wall for b in self.buckets)
        return self.calls / wall if wall else 0.0

    def pct(self, q: int) -> float:
        return percentile(self.latencies, q) * 1000


async def send(client: httpx.AsyncClient, run: Replay, session: Session) -> bytes:
    """One turn's request as the CLI sent it (its recorded headers, a dummy key, polar's session header)."""
    fixture = session.api.fixture
    path, raw = session.request()
    headers = {**fixture.headers, **AUTH[fixture.provider], "x-polar-session": f"{run.cli}-{run.stream:d}-{session.number}"}
    resp = await client.post(run.target.url(fixture, path), content=run.target.body(raw), headers=headers)
    if resp.status_code != 200 or b"event: error" in resp.content:
        raise ValueError(f"HTTP {resp.status_code}: {resp.text[:300]}")
    return resp.content


async def call(client: httpx.AsyncClient, run: Replay, session: Session) -> None:
    """One timed turn of one session; a failed call ends that session (its history can no longer grow as the
    client's would)."""
    started = time.perf_counter()
    try:
        raw = await send(client, run, session)
        run.latencies.append(time.perf_counter() - started)
        session.received(raw)
    except (httpx.HTTPError, ValueError, KeyError, StopIteration) as exc:
        run.errors.append(f"{run.target.name} session {session.number} turn {session.turns + 1}: {exc!r}"[:500])
        run.sessions.remove(session)


async def warm(client: httpx.AsyncClient, run: Replay) -> None:
    """One untimed first turn in a session of its own (start-up work, first-use caches); a target that cannot
    take the format at all fails here, and its sessions do not run."""
    session = Session(run.sessions[0].api, -1, run.stream, tool_bytes=run.sessions[0].tool_bytes)
    try:
        session.received(await send(client, run, session))
    except (httpx.HTTPError, ValueError, KeyError, StopIteration) as exc:
        run.errors.append(f"{run.target.name} cannot take this format: {exc!r}"[:500])
        run.sessions.clear()


async def bucket(client: httpx.AsyncClient, run: Replay, first: int, last: int, profile: Path | None = None) -> None:
    """Turns first..last in lock-step, CPU measured around them (and sampled by py-spy with `profile`)."""
    proxy = run.target.proxy
    profiler = None
    if profile is not None and proxy is not None and run.target.name.startswith("polar"):
        profiler = Profiler(proxy.proc.pid, profile / f"{run.cli}-{run.target.name}-{'stream' if run.stream else 'whole'}"
                                                      f"-t{first}-{last}.txt")
        await asyncio.sleep(1.0)  # py-spy attaches before the bucket's first call
    meter = CpuMeter(proxy, None)
    done = len(run.latencies)
    meter.start()
    t0 = time.perf_counter()
    for _ in range(first, last + 1):
        await asyncio.gather(*(call(client, run, s) for s in list(run.sessions)))
    wall = time.perf_counter() - t0
    cpu = meter.used()["proxy"]
    run.buckets.append(Bucket(first, last, len(run.latencies) - done, cpu, wall,
                              await asyncio.to_thread(profiler.stop) if profiler else None))


def bucket_ranges(turns: int, ends: Sequence[int]) -> list[tuple[int, int]]:
    """1..e1, e1+1..e2, ... up to `turns` (the last bucket ends at `turns`)."""
    edges = [0, *(e for e in sorted(ends) if e < turns), turns]
    return [(a + 1, b) for a, b in zip(edges, edges[1:], strict=False)]


async def play(runs: Sequence[Replay], ranges: list[tuple[int, int]], profile: Path | None = None) -> None:
    """Every run's sessions, bucket by bucket, one run's bucket after another's (a load spike hits them alike),
    after one untimed warm-up call each."""
    # Idle connections are dropped after 2 s, before a server's own keep-alive timeout (uvicorn's, under
    # LiteLLM: 5 s, httpx's default too): at 256 sessions a turn's slowest call leaves the others idle for
    # seconds, and a connection the server closes as a call reuses it is a ReadError no proxy caused.
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None, keepalive_expiry=2.0)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        for run in runs:
            await warm(client, run)
        for first, last in ranges:
            for run in runs:
                await bucket(client, run, first, last, profile)
