#!/usr/bin/env python3
"""Benchmark: real harness traffic — the six CLIs' recorded requests replayed as sessions growing to 100k+ tokens.

Each CLI's real first request (data/harness_requests/<cli>.json, scripts/record_harness_requests.py) starts
--sessions sessions at once; every turn appends the answer the client received (parsed from that provider's
response, streamed or not) and ~2 KB (--tool-bytes) of tool output in the CLI's own tool-result shape (scripts/benchkit/replay.py),
for --turns turns. The same upstream serves every target (scripts/bench_upstream.py: the scripted vLLM double,
real tokenizer, whose script makes every turn think, say a line and call the CLI's shell tool):
  direct      — the request straight to the upstream (OpenAI Chat only: the upstream speaks nothing else), with the
                token ids and logprobs polar asks for;
  polar       — `polar proxy`, token-faithful (the tokenizer given: /inference/v1/generate upstream);
  polar-chat  — `polar proxy` in chat-template mode (the upstream renders the prompt);
  litellm     — the LiteLLM proxy (scripts/bench_peers.py's set-up: one worker, hosted_vllm, the same token ids
                and logprobs asked for), on its route for that format; Responses bridged to chat completions
                (use_chat_completions_api: hosted_vllm would otherwise call the upstream's own /v1/responses).
Every CLI runs its targets in fresh processes (its non-streamed sessions, then its streamed ones), side by
side: turn buckets (--buckets) run in lock-step — every session of a target takes turn t before any takes t + 1 —
one target's bucket after another's, so a bucket's CPU (benchkit.targets.cpu_seconds of the proxy process and its
children, between the bucket's ends) is spent only on calls of those turns; one untimed warm-up call per target
first. Reported per target: proxy CPU ms per call by bucket, p50/p99 latency and added latency vs direct, calls/s,
with ratios against LiteLLM and direct; and per CLI over both stream modes (they share the processes): the whole
capture DB's bytes per unique token (bench_storage's definitions: VACUUMed size / the sum of each session's final
context), the longest context reached, peak RSS (VmHWM of the process and its children).
On 2 cores client, proxies and upstream share the CPU: read CPU per call, ratios and the growth over buckets,
not absolute latency.

    python scripts/bench_agent.py [--cli claude_code codex gemini_cli qwen_code] [--sessions 16] [--turns 120] [--tool-bytes 2000]
                                  [--buckets 10 30 60 100] [--stream both] [--no-litellm] [--segment-cache] [--markdown]
                                  [--profile DIR]   # py-spy per bucket: the request's JSON decode apart, what grew
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import signal
import sqlite3
import sys
from collections.abc import Sequence
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_storage import measure, unique_tokens  # noqa: E402
from benchkit import args as flags  # noqa: E402
from benchkit.load import streams_of  # noqa: E402
from benchkit.lockstep import Replay, ReplayTarget, bucket_ranges, play, takes_format  # noqa: E402
from benchkit.profile import PARTS, growth  # noqa: E402
from benchkit.replay import Fixture, Session, api_of, prose  # noqa: E402
from benchkit.report import Run as Bench  # noqa: E402
from benchkit.report import ms  # noqa: E402
from benchkit.report import table as new_table  # noqa: E402
from benchkit.targets import Service, peak_rss, start_litellm, start_polar, start_upstream, upstream_url  # noqa: E402

from polar.harnesses import get as harness_of  # noqa: E402

TARGETS = ("direct", "polar", "polar-chat", "litellm")
DEFAULT_CLIS = ("claude_code", "codex", "gemini_cli", "qwen_code")  # one per provider API, and Claude Code


# -- the upstream's script ---------------------------------------------------------------------------------


def script(clis: Sequence[str], turns: int) -> dict[str, Any]:
    """One rule per CLI (matched by its recorded task marker): every turn reasons, says a line and calls the
    CLI's own shell tool with a different command."""
    rng = random.Random("answers")
    rules = []
    for cli in clis:
        harness = harness_of(cli)
        steps = [{"reasoning": prose(rng, 400), "content": prose(rng, 150),
                  "tool_calls": [harness.shell_tool(f"pytest -x tests/test_{t}.py -k case_{t}")]} for t in range(turns)]
        rules.append({"match": Fixture.load(cli).marker, "steps": steps})
    return {"rules": rules}


# -- targets -----------------------------------------------------------------------------------------------


def start_targets(names: Sequence[str], fixture: Fixture, work: Path, upstream: Service, args) -> list[ReplayTarget]:
    targets = []
    for name in names:
        if not takes_format(name, fixture.provider):
            continue
        if name == "direct":
            targets.append(ReplayTarget(name, upstream_url(upstream), None))
        elif name in ("polar", "polar-chat"):
            proxy = start_polar(work, upstream, args.sync, args.tokenizer if name == "polar" else None)
            targets.append(ReplayTarget(name, proxy.base_url, proxy))
        else:
            model = fixture.first.get("model") or harness_of(fixture.cli).model  # Gemini's is in the path
            # Responses bridged to the upstream's chat endpoint (LiteLLM would call a vLLM's own /v1/responses).
            proxy = start_litellm(work, upstream, Path(args.litellm), names=[model],
                                  extra_params={"use_chat_completions_api": True})
            targets.append(ReplayTarget(name, proxy.base_url, proxy))
    return targets


@dataclass
class Run(Replay):
    """A replay with what its target's process and database show after it."""

    peak_rss: int | None = None  # bytes
    db_bytes: int | None = None
    tokens: int | None = None  # unique tokens: the sum of the sessions' final contexts (polar's database)
    context: int | None = None  # the longest context a session reached (polar's database)


# -- after a run -------------------------------------------------------------------------------------------


def finish(target: ReplayTarget, runs: list[Run]) -> None:
    """Peak RSS, then the proxy stopped (its captures committed) and polar's database measured; the figures
    go to each of the target's runs (the streamed and the non-streamed sessions share its process)."""
    if target.proxy is None:
        return
    rss = peak_rss(target.proxy.proc.pid)
    target.proxy.stop()
    db = target.db if target.db and target.db.exists() else None
    db_bytes, tokens, context = (measure(db)["whole DB"], unique_tokens(db), longest_context(db)) if db else (None,) * 3
    for run in runs:
        run.peak_rss, run.db_bytes, run.tokens, run.context = rss, db_bytes, tokens, context


def longest_context(db: Path) -> int:
    """The largest context a session reached: its last call's prompt + completion."""
    with closing(sqlite3.connect(db)) as conn:
        return conn.execute("SELECT max(prompt_len + completion_len) FROM calls WHERE status = 'ok'").fetchone()[0]


def cell(fixture: Fixture, streams: list[bool], args, upstream: Service, work: Path, progress) -> list[Run]:
    """Every target for one CLI, in fresh processes: the non-streamed sessions, then the streamed ones."""
    work.mkdir(parents=True, exist_ok=True)
    api = api_of(fixture)
    targets = start_targets(args.targets, fixture, work, upstream, args)
    runs = [Run(fixture.cli, fixture.api, stream, t, [Session(api, n, stream, tool_bytes=args.tool_bytes) for n in range(args.sessions)])
            for stream in streams for t in targets]
    try:
        for stream in streams:
            asyncio.run(play([r for r in runs if r.stream == stream], bucket_ranges(args.turns, args.buckets),
                             args.profile))
    finally:
        for target in targets:
            finish(target, [r for r in runs if r.target is target])
    for run in runs:
        progress(f"{fixture.cli:<12} {'streamed' if run.stream else 'not streamed':<12} {run.target.name:<11} "
                 f"{run.calls} calls, CPU ms/call {[round(b.cpu_ms, 1) if b.cpu_ms else None for b in run.buckets]}, "
                 f"errors {len(run.errors)}{': ' + run.errors[0] if run.errors else ''}")
    return runs


# -- report ----------------------------------------------------------------------------------------------------


def _f(value: float | None, digits: int = 1) -> str:
    return ms(value, digits)


def _ratio(a: float | None, b: float | None) -> str:
    return "–" if not a or not b else f"{a / b:.2f}"


def table(runs: list[Run], ranges: list[tuple[int, int]], title: str) -> Table:
    """One row per CLI, stream mode and target; ratios against LiteLLM and direct in the same CLI and mode."""
    out = new_table(title, ("CLI", "API", "stream", "target", "calls", "errors",
                            *(f"CPU ms/call t{a}–{b}" for a, b in ranges), "CPU ÷ LiteLLM", "p50 ms", "p99 ms",
                            "added p50 ms", "added p99 ms", "calls/s", "calls/s ÷ LiteLLM", "calls/s ÷ direct",
                            "DB B/token", "longest context", "peak RSS MB"),
                    left=("CLI", "API", "stream", "target"), no_wrap=True)
    peers = {(r.cli, r.stream, r.target.name): r for r in runs}
    for r in runs:
        lite, direct = peers.get((r.cli, r.stream, "litellm")), peers.get((r.cli, r.stream, "direct"))
        lite, base = (lite if lite is not r else None), (direct if direct is not r else None)
        out.add_row(
            r.cli, r.api, "yes" if r.stream else "no", r.target.name, str(r.calls), str(len(r.errors)),
            *(_f(b.cpu_ms) for b in r.buckets), _ratio(r.cpu_ms, lite and lite.cpu_ms),
            _f(r.pct(50)), _f(r.pct(99)), _f(base and r.pct(50) - base.pct(50)), _f(base and r.pct(99) - base.pct(99)),
            _f(r.rate), _ratio(r.rate, lite and lite.rate), _ratio(r.rate, base and base.rate),
            _f(r.db_bytes / r.tokens if r.db_bytes and r.tokens else None, 2),
            f"{r.context:,}" if r.context else "–", _f(r.peak_rss and r.peak_rss / 2**20, 0),
        )
    return out


# -- main ---------------------------------------------------------------------------------------------------------


def parse(argv: Sequence[str]) -> argparse.Namespace:
    ap = flags.parser(__doc__)
    ap.add_argument("--cli", nargs="+", default=list(DEFAULT_CLIS), help="fixtures to replay (data/harness_requests)")
    ap.add_argument("--sessions", type=int, default=16, help="sessions at once per target (16 to 256)")
    ap.add_argument("--turns", type=int, default=120, help="turns per session (~120 reach 100k tokens)")
    ap.add_argument("--tool-bytes", type=int, default=2000,
                    help="each tool result's size (2000: ~900 tokens a turn; 8000 reach 100k tokens in ~40 turns)")
    ap.add_argument("--segment-cache", action="store_true",
                    help="the upstream tokenizes what is new only (bench_upstream.py --segment-cache): for runs where "
                         "its whole-prompt tokenizing would be the wall time; chat-mode targets then gain against vLLM")
    ap.add_argument("--buckets", type=int, nargs="+", default=[10, 30, 60, 100], help="last turn of each bucket")
    ap.add_argument("--stream", choices=["no", "yes", "both"], default="both")
    ap.add_argument("--targets", nargs="+", choices=TARGETS, default=list(TARGETS))
    flags.sync_arg(ap, "FULL")
    flags.tokenizer_arg(ap)
    flags.litellm_args(ap)
    ap.add_argument("--dir", type=Path, help="keep databases and logs here (default: a temporary directory)")
    ap.add_argument("--profile", type=Path, metavar="DIR",
                    help="py-spy each polar target over each bucket (collapsed stacks in DIR): what the request's JSON "
                         "decode costs a call, the CPU without it, and the functions that grew most, first to last bucket")
    flags.markdown_arg(ap)
    args = ap.parse_args(argv)
    if args.no_litellm:
        args.targets = [t for t in args.targets if t != "litellm"]
    flags.check_litellm(ap, args, "litellm" in args.targets)
    if min(args.sessions, args.turns, args.tool_bytes) < 1:
        ap.error("--sessions, --turns and --tool-bytes must be at least 1")
    return args


def main(argv: Sequence[str] | None = None) -> list[Run]:
    if argv is None:  # run as a script: a long run stopped with `kill` stops its servers too
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse(argv)
    fixtures = [Fixture.load(name) for name in args.cli]
    ranges = bucket_ranges(args.turns, args.buckets)
    runs: list[Run] = []
    with Bench("bench_agent.py", argv, width=400, keep=args.dir) as bench:
        work = bench.work
        (work / "script.json").write_text(json.dumps(script(args.cli, args.turns)))
        upstream = bench.start(start_upstream(work, args.tokenizer, ["--script", str(work / "script.json"),
                                                                     "--max-model-len", "1048576", "--cache-entries",
                                                                     "64", *(["--segment-cache"] if args.segment_cache
                                                                             else [])]))
        for fixture in fixtures:
            cell_dir = work / fixture.cli
            runs += cell(fixture, streams_of(args.stream), args, upstream, cell_dir, bench.progress)
            if not args.dir:
                shutil.rmtree(cell_dir, ignore_errors=True)  # databases of finished cells: disk, not figures
    title = (f"Real harness traffic: {args.sessions} sessions x {args.turns} turns per target, in lock-step; one process "
             f"per proxy (polar captures synchronous={args.sync}; LiteLLM --num_workers 1); {os.cpu_count()} cores shared")
    bench.report(table(runs, ranges, title),
                 [*unsupported(args, fixtures), *(line for r in runs for line in profile_lines(r))], args.markdown)
    return runs


def profile_lines(run: Run) -> list[str]:
    """What py-spy saw of a run's buckets: the named parts per call, the CPU per call without the request's JSON
    decode (issue 15's flat-in-turns target leaves it out), last bucket ÷ first, and what grew most."""
    buckets = [b for b in run.buckets if b.profile is not None and b.calls and b.cpu_ms is not None]
    if len(buckets) < 2:
        return []
    name = f"{run.cli} {'streamed' if run.stream else 'not streamed'} {run.target.name}"
    lines = [f"profile {name}: CPU ms/call " + " / ".join(_f(b.cpu_ms) for b in buckets)
             + "; sampled with the GIL held " + " / ".join(_f(b.profile.total_ms() / b.calls) for b in buckets)]
    for part, (file, func) in PARTS.items():
        lines.append(f"  {part} ms/call " + " / ".join(_f(b.profile.part_ms(file, func) / b.calls, 2) for b in buckets))
    file, func = PARTS["request JSON decode"]
    rest = [b.cpu_ms - b.profile.part_ms(file, func) / b.calls for b in buckets]
    lines.append("  CPU ms/call without the request JSON decode " + " / ".join(_f(r) for r in rest)
                 + f": last ÷ first {rest[-1] / rest[0]:.2f} (target <= 1.5)")
    first, last = buckets[0], buckets[-1]
    lines.append(f"  grew most, t{first.first}–{first.last} → t{last.first}–{last.last} (own ms/call): " + "; ".join(
        f"{fn} {a:.2f} → {b:.2f}" for fn, a, b in growth(first.profile, first.calls, last.profile, last.calls)))
    return lines


def unsupported(args, fixtures: list[Fixture]) -> list[str]:
    skipped = sorted({f.api for f in fixtures if not takes_format("direct", f.provider)})
    return [f"direct: only the OpenAI Chat format (the upstream speaks nothing else); not for {', '.join(skipped)}"] \
        if "direct" in args.targets and skipped else []


if __name__ == "__main__":
    main()
