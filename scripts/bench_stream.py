#!/usr/bin/env python3
"""Benchmark: streamed calls — time to first token and per-chunk overhead, polar vs LiteLLM vs direct.

One upstream (scripts/bench_upstream.py: the scripted vLLM double behind an answer cache) streams every
answer paced like an engine: the first token after --first-token-delay-ms (queue + prefill; the HTTP
headers come with it, as from vLLM's uvicorn), then one token every --token-delay-ms. Five targets get
the same conversation (thinking off, so every sampled token is answer text), side by side:
  direct chat            — vLLM's streamed chat completion, exactly the body polar's chat mode sends
                           (read back from the upstream: `return_token_ids`, `logprobs`, include_usage);
  direct generate        — the streamed /inference/v1/generate call polar's token-faithful mode sends
                           (read back from the upstream: the prompt ids polar rendered);
  polar chat             — an Anthropic Messages streamed call through `polar proxy` (chat-template mode);
  polar token-faithful   — the same through `polar proxy --tokenizer DIR` (ids decoded and parsed by polar);
  litellm                — the same Anthropic call through the LiteLLM proxy's /v1/messages, `hosted_vllm`
                           against the same upstream, asking it for the same token ids and logprobs, and for
                           the same template kwargs (LiteLLM turns "thinking disabled" into a
                           `reasoning_effort` that Qwen's chat templates ignore).
Per call the client records when each event carrying answer text (or token ids) arrives:
  TTFT        — request sent → first such event (direct: the first chunk with text or token ids;
                Anthropic: the first content_block_delta); "added" is p50 (p99) minus the baseline's p50 (p99),
                the baseline being direct chat for polar chat and LiteLLM, direct generate for token-faithful;
  per chunk   — each event of a proxied call is paired with the baseline token that made its text available
                (the answer text so far; generate ids decoded with the tokenizer) and compared with that
                token's median arrival over the baseline's calls at the same concurrency: the added latency
                per chunk, p50 and p99 over every chunk of every call;
  stream      — request sent → end of the stream;
  CPU         — the proxy process's user+system time per streamed call (from /proc, timed part only).
A second table splits the time to first token at one client where it is spent, each call lined up by
wall clock with the upstream's log of its streams (request arrival, first token written) and, for polar,
with its capture row (t_start: the gateway has the request; t_first: the first answer event is rendered);
its last columns time every answer event from when the upstream was due to write its token.
Each cell's calls run in --rounds blocks, the targets taking turns block by block (a load spike on
this shared machine hits them alike); each block opens its connections with one non-streamed call
each (the upstream paces streams only), untimed.

    python scripts/bench_stream.py [--requests 200] [--concurrency 1 16] [--answer-tokens 200]
                                   [--token-delay-ms 10] [--first-token-delay-ms 20] [--no-litellm] [--markdown]
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import os
import sqlite3
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchkit import args as cli  # noqa: E402
from benchkit.load import percentile  # noqa: E402
from benchkit.report import Run, ms, table  # noqa: E402
from benchkit.stream import (  # noqa: E402
    CHAT,
    GENERATE,
    Call,
    StreamCell,
    StreamTarget,
    anthropic_stream_target,
    first_call,
    run_stream_matrix,
)
from benchkit.targets import (  # noqa: E402
    Service,
    start_litellm,
    start_polar,
    start_upstream,
    upstream_last_body,
    upstream_stats,
    upstream_url,
)

# LiteLLM maps "thinking disabled" to `reasoning_effort: none`, which Qwen's chat templates ignore (the model
# would think first, a different and longer answer): it also sends what polar sends for it.
LITELLM_EXTRA = {"chat_template_kwargs": {"enable_thinking": False}}



# -- analysis -------------------------------------------------------------------------------------


class TextEnds:
    """How much answer text there is after each token of a generate answer (its ids decoded)."""

    def __init__(self, tokenizer_dir: str | Path):
        from tokenizers import Tokenizer

        self.tokenizer = Tokenizer.from_file(str(Path(tokenizer_dir) / "tokenizer.json"))
        self._known: dict[tuple[int, ...], list[int]] = {}

    def text(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def __call__(self, ids: Sequence[int]) -> list[int]:
        key = tuple(ids)
        if key not in self._known:  # every call samples the same answer: decoded once
            self._known[key] = [len(self.text(ids[:k])) for k in range(1, len(ids) + 1)]
        return self._known[key]


@dataclass
class Baseline:
    """A direct target's token arrivals at one concurrency: answer text after token k, its median arrival."""

    ends: list[int]
    arrivals: list[float]

    @classmethod
    def of(cls, cell: StreamCell, text_ends: TextEnds) -> Baseline | None:
        calls = [c for c in cell.calls if len(c.marks) == len(cell.calls[0].marks)] if cell.calls else []
        if not calls:
            return None
        if cell.target.kind == GENERATE:
            by_count = text_ends(calls[0].ids)
            ends = [by_count[count - 1] for count, _ in calls[0].marks]
        else:
            ends = [size for size, _ in calls[0].marks]
        arrivals = [statistics.median(c.marks[k][1] for c in calls) for k in range(len(ends))]
        return cls(ends, arrivals)

    def added(self, call: Call) -> list[float]:
        """Per event of a proxied call: its arrival minus that of the baseline token that made its text available."""
        last = len(self.ends) - 1
        return [t - self.arrivals[min(bisect.bisect_left(self.ends, size), last)] for size, t in call.marks]


@dataclass
class Figures:
    """One table row's numbers (ms)."""

    cell: StreamCell
    ttft: tuple[float, float]
    total: tuple[float, float]
    tokens: list[int]
    chunks: list[int]
    ttft_added: tuple[float, float] | None = None
    chunk_added: tuple[float, float] | None = None


def p50_p99(values: Sequence[float]) -> tuple[float, float]:
    return percentile(values, 50) * 1000, percentile(values, 99) * 1000


def figures(cells: list[StreamCell], text_ends: TextEnds) -> list[Figures]:
    rows = {}
    for cell in cells:
        calls = cell.calls
        rows[(cell.target.name, cell.clients)] = Figures(
            cell, p50_p99([c.ttft for c in calls]), p50_p99([c.total for c in calls]),
            sorted({c.tokens for c in calls}), sorted({len(c.marks) for c in calls}))
    for cell in cells:
        base_name = cell.target.baseline
        base = rows.get((base_name, cell.clients)) if base_name else None
        if base is None or not cell.calls:
            continue
        row = rows[(cell.target.name, cell.clients)]
        row.ttft_added = (row.ttft[0] - base.ttft[0], row.ttft[1] - base.ttft[1])
        if (baseline := Baseline.of(base.cell, text_ends)) is not None:
            row.chunk_added = p50_p99([d for c in cell.calls for d in baseline.added(c)])
    return list(rows.values())


def _ratio(a: float | None, b: float | None) -> str:
    return "–" if a is None or not b else f"{a / b:.2f}"


def _counts(values: list[int]) -> str:
    return "/".join(map(str, values)) or "–"


COLUMNS = ("clients", "target", "vs", "calls", "errors", "tokens", "chunks", "TTFT p50 ms", "TTFT p99 ms",
           "added TTFT p50 ms", "added TTFT p99 ms", "TTFT ×direct", "added/chunk p50 ms", "added/chunk p99 ms",
           "stream p50 ms", "stream ×direct", "proxy CPU ms/call", "CPU ×litellm", "upstream CPU ms/call")


def results_table(rows: list[Figures], title: str) -> Table:
    out = table(title, COLUMNS, left=("target", "vs"), no_wrap=True)
    by = {(r.cell.target.name, r.cell.clients): r for r in rows}
    for r in rows:
        cell = r.cell
        base = by.get((cell.target.baseline, cell.clients))
        peer = by.get(("litellm", cell.clients))
        cpu = cell.cpu_ms(cell.proxy_cpu)
        peer_cpu = peer.cell.cpu_ms(peer.cell.proxy_cpu) if peer and cell.target.name != "litellm" else None
        out.add_row(
            str(cell.clients), cell.target.name, cell.target.baseline or "–", str(len(cell.calls) + len(cell.errors)),
            str(len(cell.errors)), _counts(r.tokens), _counts(r.chunks), ms(r.ttft[0]), ms(r.ttft[1]),
            ms(r.ttft_added and r.ttft_added[0]), ms(r.ttft_added and r.ttft_added[1]),
            _ratio(r.ttft[0], base.ttft[0]) if base else "–",
            ms(r.chunk_added and r.chunk_added[0]), ms(r.chunk_added and r.chunk_added[1]),
            ms(r.total[0], 1), _ratio(r.total[0], base.total[0]) if base else "–",
            ms(cpu), _ratio(cpu, peer_cpu) if peer_cpu is not None else "–", ms(cell.cpu_ms(cell.upstream_cpu)),
        )
    return out


def target_line(rows: list[Figures]) -> str:
    by = {(r.cell.target.name, r.cell.clients): r for r in rows}
    added = [by[(name, 1)].ttft_added if (name, 1) in by else None for name in ("polar chat", "polar token-faithful")]
    if any(a is None for a in added):
        return "target: polar adds ≤ 5 ms p50 TTFT at one client: not measured (no 1-client cell)"
    chat, faithful = (a[0] for a in added)
    met = chat <= 5 and faithful <= 5
    return (f"target: polar adds ≤ 5 ms p50 TTFT at one client: {chat:.2f} ms (chat), {faithful:.2f} ms "
            f"(token-faithful) — {'met' if met else 'NOT met'}")


def client_line(cells: list[StreamCell]) -> str:
    """The load generator shares the machine: how much CPU it took per call."""
    parts = []
    for clients in sorted({c.clients for c in cells}):
        mine = [c for c in cells if c.clients == clients]
        calls = sum(len(c.calls) for c in mine)
        wall = sum(c.wall for c in mine)
        cpu = sum(c.client_cpu for c in mine)
        if calls and wall:
            parts.append(f"{cpu * 1000 / calls:.1f} ms CPU per call at {clients} client{'s' if clients > 1 else ''} "
                         f"({cpu / wall:.0%} of a core)")
    return "load generator (one Python process, every event parsed): " + "; ".join(parts)


def same_answer_lines(rows: list[Figures]) -> list[str]:
    tokens = {t for r in rows for t in r.tokens}
    if len(tokens) == 1:
        return [f"every call of every target sampled the same {tokens.pop()} tokens"]
    return [f"NOT the same answer everywhere: tokens per answer {sorted(tokens)}"]


# -- where the time to first token goes (one client) ---------------------------------------------


@dataclass
class Split:
    """A target's time to first token at one client, split at the upstream (and inside polar), medians in ms."""

    target: str
    calls: int
    to_upstream: float  # the client sends → the upstream has the request
    from_upstream: float  # the upstream writes the first token → the client has the first answer event
    polar: tuple[float, float, float, float] | None = None  # → gateway starts, → upstream, → rendered, → client
    per_chunk: tuple[float, float] | None = None  # each token: when the upstream was to write it → the client has it


def _within(keys: list[float], lo: float, hi: float) -> int | None:
    """The index of the one sorted key in [lo, hi] (calls at one client do not overlap)."""
    i = bisect.bisect_left(keys, lo)
    return i if i < len(keys) and keys[i] <= hi else None


def capture_times(target: StreamTarget) -> list[tuple[float, float]]:
    """(t_start, t_first) of polar's streamed captures, from its database (polar's own clock readings)."""
    if target.proxy is None or target.proxy.db is None:
        return []
    db = target.proxy.db
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
            rows = conn.execute("SELECT t_start, t_first FROM calls WHERE stream = 1 AND t_first IS NOT NULL").fetchall()
    except sqlite3.Error:
        return []
    return sorted(rows)


def tokens_of(target: StreamTarget, call: Call, baseline: Baseline) -> list[tuple[int, float]]:
    """(index of the token that made the event's text available, arrival) per answer event of a call."""
    if target.kind == CHAT:
        return [(k, t) for k, (_, t) in enumerate(call.marks)]
    if target.kind == GENERATE:
        return [(count - 1, t) for count, t in call.marks]
    last = len(baseline.ends) - 1
    return [(min(bisect.bisect_left(baseline.ends, size), last), t) for size, t in call.marks]


def splits(cells: list[StreamCell], upstream: Service, text_ends: TextEnds, first_s: float,
           token_s: float) -> list[Split]:
    """Each one-client call lined up with the upstream's stream log (and polar's capture row) by wall clock."""
    log = sorted((arrival, first) for _, arrival, first in
                 httpx.get(f"{upstream_url(upstream)}/_bench/streams", timeout=30).json())
    arrivals = [a for a, _ in log]
    ones = {c.target.name: c for c in cells if c.clients == 1}
    out = []
    for cell in ones.values():
        base = ones.get(cell.target.baseline or cell.target.name)
        baseline = Baseline.of(base, text_ends) if base else None
        lags: list[float] = []
        captures = capture_times(cell.target) if cell.target.name.startswith("polar") else []
        starts = [t for t, _ in captures]
        parts: list[tuple[float, ...]] = []
        inner: list[tuple[float, ...]] = []
        for call in cell.calls:
            first_event = call.sent + call.ttft
            if (i := _within(arrivals, call.sent, first_event)) is None:
                continue
            arrival, written = log[i]
            parts.append((arrival - call.sent, first_event - written))
            if baseline is not None:  # token k was due at arrival + first_s + k * token_s
                lags += [call.sent + t - arrival - first_s - k * token_s for k, t in tokens_of(cell.target, call, baseline)]
            if (j := _within(starts, call.sent, arrival)) is not None:
                t_start, t_first = captures[j]
                inner.append((t_start - call.sent, arrival - t_start, t_first - written, first_event - t_first))
        if parts:
            med = [statistics.median(p[k] for p in parts) * 1000 for k in range(2)]
            polar = tuple(statistics.median(p[k] for p in inner) * 1000 for k in range(4)) if inner else None
            out.append(Split(cell.target.name, len(parts), med[0], med[1], polar, p50_p99(lags) if lags else None))
    return out


SPLIT_COLUMNS = ("target", "calls", "client → upstream", "upstream's 1st token → client", "· client → polar gateway",
                 "· gateway → upstream", "· 1st token → polar rendered it", "· rendered → client",
                 "each token due → client p50", "p99")


def split_table(rows: list[Split]) -> Table:
    out = table("Where the time to first token goes at 1 client (medians, ms; the upstream's own 1st-token delay "
                "left out; · = inside polar, from its capture's t_start/t_first)", SPLIT_COLUMNS, left=("target",),
                no_wrap=True)
    for r in rows:
        inner = [ms(v) for v in r.polar] if r.polar else ["–"] * 4
        lag = [ms(v) for v in r.per_chunk] if r.per_chunk else ["–"] * 2
        out.add_row(r.target, str(r.calls), ms(r.to_upstream), ms(r.from_upstream), *inner, *lag)
    return out


# -- set-up ---------------------------------------------------------------------------------------


def start_targets(work: Path, args: argparse.Namespace, services: list[Service]) -> tuple[list[StreamTarget],
                                                                                              Service]:
    """Every process up, every target answered once, all with the same answer."""
    pace = ["--token-delay-ms", str(args.token_delay_ms), "--first-token-delay-ms", str(args.first_token_delay_ms),
            "--answer-tokens", str(args.answer_tokens)]
    upstream = start_upstream(work, args.tokenizer, pace)
    services.append(upstream)
    url = upstream_url(upstream)
    polar_chat = start_polar(work, upstream, args.sync)
    services.append(polar_chat)
    polar_tokens = start_polar(work, upstream, args.sync, tokenizer=args.tokenizer)
    services.append(polar_tokens)
    proxied = [anthropic_stream_target("polar chat", polar_chat, "direct chat"),
               anthropic_stream_target("polar token-faithful", polar_tokens, "direct generate")]
    if not args.no_litellm:
        litellm = start_litellm(work, upstream, Path(args.litellm), extra_body=LITELLM_EXTRA)
        services.append(litellm)
        proxied.append(anthropic_stream_target("litellm", litellm, "direct chat"))
    # The direct calls are exactly what polar sent upstream for the Anthropic call: read back from the upstream.
    first = {proxied[0].name: asyncio.run(first_call(proxied[0]))}
    chat_body = upstream_last_body(upstream, "/v1/chat/completions")
    first[proxied[1].name] = asyncio.run(first_call(proxied[1]))
    generate_body = upstream_last_body(upstream, "/inference/v1/generate")
    plain = {"content-type": "application/json"}
    direct = [StreamTarget("direct chat", f"{url}/v1/chat/completions", chat_body, plain, kind=CHAT),
              StreamTarget("direct generate", f"{url}/inference/v1/generate", generate_body, plain, kind=GENERATE)]
    for target in [*direct, *proxied[2:]]:
        first[target.name] = asyncio.run(first_call(target))
    check_answers(first, TextEnds(args.tokenizer))
    return [*direct, *proxied], upstream


def check_answers(first: dict[str, Call], text_ends: TextEnds) -> None:
    """Every target streamed the same answer: the same text (generate: its ids decoded) and token count."""
    want = first["direct chat"]
    for name, call in first.items():
        text = text_ends.text(call.ids) if name == "direct generate" else call.text
        if text != want.text or call.tokens != want.tokens:
            raise RuntimeError(f"{name} streamed {call.tokens} tokens, {text[:80]!r}…; direct chat streamed "
                               f"{want.tokens} tokens, {want.text[:80]!r}…")


def main(argv: Sequence[str] | None = None) -> list[Figures]:
    ap = cli.parser(__doc__)
    cli.load_args(ap, requests=200, concurrency=(1, 16), what="streamed calls")
    ap.add_argument("--rounds", type=int, default=4, help="blocks each cell's calls are split into, targets taking turns")
    ap.add_argument("--answer-tokens", type=int, default=200, help="about how many tokens every answer has")
    ap.add_argument("--token-delay-ms", type=float, default=10.0, help="the upstream's pace: ms between tokens")
    ap.add_argument("--first-token-delay-ms", type=float, default=20.0,
                    help="ms before the first token (queue + prefill; the stream's headers wait too)")
    cli.sync_arg(ap, "FULL")
    cli.tokenizer_arg(ap, help="tokenizer dir: the scripted double's, and polar token-faithful's")
    cli.litellm_args(ap)
    cli.markdown_arg(ap)
    argv = list(sys.argv[1:] if argv is None else argv)
    args = ap.parse_args(argv)
    cli.check_args(ap, args)
    if args.rounds < 1 or args.answer_tokens < 2 or args.token_delay_ms < 0 or args.first_token_delay_ms < 0:
        ap.error("--rounds must be at least 1, --answer-tokens at least 2, the delays not negative")
    cli.check_litellm(ap, args)

    with Run("bench_stream.py", argv, width=400) as run:
        targets, upstream = start_targets(run.work, args, run.services)
        cells = asyncio.run(run_stream_matrix(targets, upstream, args.concurrency, args.requests, args.rounds, run.progress))
        stats = upstream_stats(upstream)
        where = splits(cells, upstream, TextEnds(args.tokenizer), args.first_token_delay_ms / 1000,
                       args.token_delay_ms / 1000)
    rows = figures(cells, TextEnds(args.tokenizer))
    title = (f"Streaming: polar{'' if args.no_litellm else ' and LiteLLM'} vs direct upstream (paced: first token after "
             f"{args.first_token_delay_ms:g} ms, then one every {args.token_delay_ms:g} ms; 1 process each, polar "
             f"captures synchronous={args.sync}; {os.cpu_count()} cores shared by client, proxies and upstream)")
    lines = [target_line(rows), *same_answer_lines(rows), client_line(cells), stats]
    run.report([results_table(rows, title), *([split_table(where)] if where else [])], lines, args.markdown)
    return rows


if __name__ == "__main__":
    main()
