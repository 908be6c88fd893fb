#!/usr/bin/env python3
"""Benchmark: fleet routing (polar/upstream/fleet) with 4-8 scripted replicas at 256 sessions.

polar's FleetBackend drives scripted replicas in-process: each replica is a TEST DOUBLE of a vLLM server
that models what routing acts on (an LRU prefix cache of message blocks, a prefill time per uncached token,
a decode time per sampled token, many sequences at once) and nothing else, so the figures are routing's
alone. Sessions are samples of tasks (--samples per task) of one harness (one system prompt and tools),
each --turns calls long, all running at once. Reported: routing's cost per call (call_shape + place: µs,
median and p99), the balance (each replica's calls, sessions and peak in-flight tokens; max/mean of the
tokens each served), affinity kept (a session's call on the replica of its last call), and the modelled
prefix-cache hit rate, for polar's routing and for round-robin on the same sessions.

    python scripts/bench_fleet.py [--replicas 8] [--sessions 256] [--turns 6] [--samples 8] [--json]
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import statistics
import sys
import time
import zlib
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchkit import args as cli  # noqa: E402
from benchkit.report import Run, table  # noqa: E402
from benchkit.targets import REPO  # noqa: E402, F401  (puts the repository on sys.path too)

from polar.canonical import ChatRequest, ChatResult, Message, TextPart, Tool, Usage  # noqa: E402
from polar.sessions.fingerprints import message_fingerprint  # noqa: E402
from polar.sessions.state import SessionState, SessionView  # noqa: E402
from polar.upstream.fleet.backend import FleetBackend  # noqa: E402
from polar.upstream.fleet.routing import RoundRobin, call_shape  # noqa: E402

SYSTEM = "You are a coding agent. Work in the repository, run the tests, and fix what fails. " * 40
TOOLS = [Tool(name=name, description=f"{name} in the workspace", parameters={"type": "object"})
         for name in ("read_file", "write_file", "run", "search")]


@dataclass
class ScriptedReplica:
    """A TEST DOUBLE of one vLLM replica for this benchmark: a prefix cache of `cache_tokens` (LRU over the
    chained digests of a prompt's messages), prefill and decode paced by `tick` seconds per 1000 tokens."""

    cache_tokens: int
    tick: float
    cache: OrderedDict = field(default_factory=OrderedDict)
    cached: int = 0
    queried: int = 0
    hits: int = 0
    served_tokens: int = 0

    async def complete(self, request: ChatRequest, call_id: str, session: SessionView | None = None) -> ChatResult:
        chain, hit, total, cached_so_far = b"", 0, 0, True
        for message in request.messages:
            size = len(message.text()) // 4 + 4
            chain = hashlib.blake2b(chain + message_fingerprint(message).encode(), digest_size=12).digest()
            total += size
            cached_so_far = cached_so_far and chain in self.cache  # a prefix cache: only a leading run counts
            if chain in self.cache:
                self.cache.move_to_end(chain)
                hit += size if cached_so_far else 0
            else:
                self.cache[chain] = size
                self.cached += size
        while self.cached > self.cache_tokens:
            _, size = self.cache.popitem(last=False)
            self.cached -= size
        self.queried, self.hits, self.served_tokens = self.queried + total, self.hits + hit, self.served_tokens + total
        decode = 0.1 + zlib.crc32(call_id.encode()) % 100 / 100  # answers of different lengths: the sessions fall out of step
        await asyncio.sleep(self.tick * ((total - hit) / 1000 + decode))  # prefill of the uncached part + a decode
        return ChatResult(id=call_id, model="scripted", created=0, content=f"done {call_id}",
                          usage=Usage(prompt_tokens=total, completion_tokens=16))

    async def model(self) -> str:
        return "scripted"

    def template_traits(self):
        return None

    async def aclose(self) -> None:
        pass


def _request(task: int, turns: list[str]) -> ChatRequest:
    messages = [Message(role="system", content=[TextPart(text=SYSTEM)]),
                Message(role="user", content=[TextPart(text=f"Task {task}: the tests in module {task} fail. " * 20)])]
    for n, text in enumerate(turns):
        messages += [Message(role="assistant", content=[TextPart(text=f"I run step {n}.")]),
                     Message(role="user", content=[TextPart(text=text)])]
    return ChatRequest(model="m", messages=messages, tools=TOOLS)


async def run(replicas: int, sessions: int, turns: int, samples: int, round_robin: bool, tick: float,
              cache_tokens: int, imbalance: float) -> dict:
    doubles = [ScriptedReplica(cache_tokens, tick) for _ in range(replicas)]
    fleet = FleetBackend([(f"http://replica-{i}", d) for i, d in enumerate(doubles)], imbalance)
    if round_robin:
        fleet.router = RoundRobin(fleet.replicas)
    costs: list[float] = []
    kept = moved = 0
    peaks = {r.url: 0 for r in fleet.replicas}

    async def session(n: int) -> None:
        nonlocal kept, moved
        state, last = SessionState(), None
        history: list[str] = []
        for turn in range(turns):
            request = _request(n // samples, history)
            view = SessionView(state, [message_fingerprint(m) for m in request.messages], f"s{n}")
            t0 = time.perf_counter()
            call_shape(request, view)  # what the fleet computes per call, timed on its own
            costs.append(time.perf_counter() - t0)
            result = await fleet.complete(request, f"s{n}-{turn}", view)
            if last is not None:
                kept, moved = kept + (result.replica == last), moved + (result.replica != last)
            last = result.replica
            for replica in fleet.replicas:
                peaks[replica.url] = max(peaks[replica.url], replica.load)
            history.append(f"The output of step {turn} of session {n}: " + "line of output " * 200)

    original = fleet.router.place

    def timed_place(shape, exclude=()):
        t0 = time.perf_counter()
        out = original(shape, exclude)
        costs[-1] += time.perf_counter() - t0
        return out

    fleet.router.place = timed_place
    t0 = time.perf_counter()
    await asyncio.gather(*(session(n) for n in range(sessions)))
    wall = time.perf_counter() - t0
    served = [d.served_tokens for d in doubles]
    status = fleet.status()
    return {
        "routing": "round-robin" if round_robin else "polar",
        "replicas": replicas, "sessions": sessions, "imbalance": imbalance, "calls": len(costs), "wall_s": round(wall, 2),
        "routing_us_median": round(statistics.median(costs) * 1e6, 1),
        "routing_us_p99": round(sorted(costs)[int(len(costs) * 0.99) - 1] * 1e6, 1),
        "affinity_kept": round(kept / max(kept + moved, 1), 4),
        "served_max_over_mean": round(max(served) / (sum(served) / len(served)), 3),
        "prefix_hit_rate": round(sum(d.hits for d in doubles) / max(sum(d.queried for d in doubles), 1), 4),
        "per_replica": [{"url": r["url"], "calls": r["calls"], "sessions": r["sessions"],
                         "peak_in_flight_tokens": peaks[r["url"]]} for r in status["replicas"]],
        "placements": status["routing"],
    }


def main(argv: list[str] | None = None) -> list[dict]:
    parser = cli.parser(__doc__)
    parser.add_argument("--replicas", type=int, default=8)
    parser.add_argument("--sessions", type=int, default=256)
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--samples", type=int, default=8, help="sessions per task (samples of one prompt)")
    parser.add_argument("--tick", type=float, default=0.01, help="scripted seconds per 1000 prefilled tokens")
    parser.add_argument("--cache-tokens", type=int, default=400_000, help="each replica's prefix cache, tokens")
    parser.add_argument("--imbalance", type=float, default=1.5, help="the bound (polar_fleet_imbalance / 100)")
    parser.add_argument("--json", action="store_true")
    cli.markdown_arg(parser)
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    bench = Run("bench_fleet.py", argv)
    results = [asyncio.run(run(args.replicas, args.sessions, args.turns, args.samples, rr, args.tick,
                               args.cache_tokens, args.imbalance)) for rr in (False, True)]
    if args.json:
        print(json.dumps(results, indent=1))
        return results
    out = table(f"Fleet routing: {args.sessions} sessions x {args.turns} turns on {args.replicas} scripted replicas",
                ("routing", "replicas", "sessions", "calls", "routing µs/call p50 / p99", "affinity kept",
                 "tokens served max/mean", "sessions per replica", "prefix-cache hit rate (modelled)"),
                left=("routing", "sessions per replica"))
    for r in results:
        held = "–" if r["routing"] == "round-robin" else "/".join(str(p["sessions"]) for p in r["per_replica"])
        out.add_row(r["routing"], str(r["replicas"]), str(r["sessions"]), str(r["calls"]),
                    f"{r['routing_us_median']} / {r['routing_us_p99']}", f"{r['affinity_kept']:.1%}",
                    str(r["served_max_over_mean"]), held, f"{r['prefix_hit_rate']:.1%}")
    bench.report(out, [f"{r['routing']} placements: {r['placements']}" for r in results], args.markdown)
    return results


if __name__ == "__main__":
    main()
