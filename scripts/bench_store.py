#!/usr/bin/env python3
"""Benchmark: the capture store's write rate under concurrent sessions, and its bytes per session.

write rate — 1, 16 … 256 sessions at once write their calls through a real CaptureWriter
  (polar/capture/writer.py) exactly as the gateway does: start() the pending row,
  then finish() the completion (raw body, canonical request, result, response body, linear token
  columns) and await its commit, for each capture commit mode (--sync FULL, polar's default: the
  commit of a group holding completions is fsynced; NORMAL: committed to the WAL, no fsync). Every
  session replays one synthetic coding-agent session of --session-size tokens (scripts/bench_tokens.py
  builds it, prompts token-faithful), its canonical messages tagged per session so the content-
  addressed message table stores each session's messages as it would for different real sessions.
  Nothing else runs on the event loop: this is the store's own capacity on this machine.
bytes per session — one session per size written the same way (scripts/bench_tokens.py's
  store_session), the database file broken down by where its bytes go.

    python scripts/bench_store.py [--sessions 1 16 256] [--sync FULL NORMAL] [--session-size 16k]
                                  [--rows 3000] [--sizes 1k 4k 16k 64k 128k] [--dir DIR] [--markdown]
"""

from __future__ import annotations

import asyncio
import math
import sqlite3
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.table import Table

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import bench_tokens as tokens  # noqa: E402  (puts the repository on sys.path too)
from benchkit import args as cli  # noqa: E402
from benchkit.args import parse_size, size_label  # noqa: E402
from benchkit.load import percentile  # noqa: E402
from benchkit.report import Run, table  # noqa: E402
from benchkit.store import GatewayCall, store_session, used_bytes, write_call  # noqa: E402

from polar.capture.schema import stored_bytes  # noqa: E402
from polar.capture.writer import CaptureWriter  # noqa: E402
from polar.sessions.state import SessionState  # noqa: E402
from polar.tokens import ChatTemplate  # noqa: E402

# -- one synthetic session, made ready to replay ----------------------------------------------------


@dataclass
class Session:
    """A synthetic session as the gateway hands its calls to the store."""

    size: int
    tokens: int  # final prompt + sample
    calls: list[GatewayCall]


def synthesize(synth: tokens.SessionSynth, size: int, turns: int | None) -> Session:
    calls = synth.session(size, turns or tokens.auto_turns(size))
    built = tokens.build_prompts(synth.template, calls, repeat=1)
    return Session(size, len(built[-1].prompt) + len(calls[-1].sampled),
                   tokens.gateway_calls(calls, built, synth.seed))


def tagged_canonicals(session: Session, tag: str) -> list[dict[str, Any]]:
    """Each call's canonical request with its messages made this session's own (history is append-only,
    so message i is the same message in every call that has it, and is tagged once)."""
    tagged: dict[int, dict[str, Any]] = {}

    def own(i: int, message: dict[str, Any]) -> dict[str, Any]:
        if i not in tagged:
            parts = [dict(p) for p in message.get("content", [])]
            text = next((p for p in parts if p.get("type") == "text"), None)
            if text is not None:
                text["text"] = f"[{tag}] {text['text']}"
            else:
                parts.insert(0, {"type": "text", "text": f"[{tag}]"})
            tagged[i] = {**message, "content": parts}
        return tagged[i]

    return [{**c.finish["canonical"], "messages": [own(i, m) for i, m in enumerate(c.finish["canonical"]["messages"])]}
            for c in session.calls]


# -- write rate -----------------------------------------------------------------------------------


@dataclass
class Rate:
    sync: str
    sessions: int
    rows: int
    wall: float
    cpu: float  # seconds of this process (event loop + writer thread)
    db_bytes: int  # pages in use after the run
    latencies: list[float]  # per call: begin → completion committed

    def pct(self, q: int) -> float:
        return percentile(self.latencies, q) * 1000


def write_rate(session: Session, sync: str, concurrency: int, min_rows: int, workdir: Path) -> Rate:
    """`concurrency` sessions at once, each writer replaying whole sessions until `min_rows` are written."""
    rounds = max(1, math.ceil(min_rows / (concurrency * len(session.calls))))
    names = [f"s{w:03d}-{r:03d}" for w in range(concurrency) for r in range(rounds)]
    canonicals = {name: tagged_canonicals(session, name) for name in names}  # before the clock starts
    path = workdir / f"rate-{sync.lower()}-{concurrency}.db"
    store = CaptureWriter(path, synchronous=sync)
    latencies: list[float] = []

    async def writer(w: int) -> None:
        for r in range(rounds):
            name = f"s{w:03d}-{r:03d}"
            state = SessionState()
            for i, call in enumerate(session.calls):
                t = time.perf_counter()
                await write_call(store, state, name, call, f"{name}-{i:04d}", canonicals[name][i])
                latencies.append(time.perf_counter() - t)

    async def run() -> float:
        t0 = time.perf_counter()
        await asyncio.gather(*(writer(w) for w in range(concurrency)))
        return time.perf_counter() - t0

    cpu0 = time.process_time()
    wall = asyncio.run(run())
    cpu = time.process_time() - cpu0
    store.close()
    with sqlite3.connect(path) as conn:
        size = used_bytes(conn)
    conn.close()
    return Rate(sync, concurrency, len(latencies), wall, cpu, size, latencies)


def rate_table(rates: list[Rate], session: Session) -> Table:
    out = table(f"Capture store write rate: concurrent sessions of {size_label(session.size)} "
                f"({session.tokens} tokens, {len(session.calls)} calls each), through CaptureWriter",
                ("sync", "sessions", "rows", "rows/s", "MB/s", "commit p50 ms", "commit p99 ms", "CPU ms/row",
                 "vs 1 session"), left=("sync",))
    single = {r.sync: r for r in rates if r.sessions == 1}
    for r in rates:
        base = single.get(r.sync)
        out.add_row(r.sync, str(r.sessions), str(r.rows), f"{r.rows / r.wall:.0f}",
                    f"{r.db_bytes / r.wall / 1e6:.1f}", f"{r.pct(50):.2f}", f"{r.pct(99):.2f}",
                    f"{r.cpu * 1000 / r.rows:.2f}",
                    f"{(r.rows / r.wall) / (base.rows / base.wall):.1f}x" if base else "–")
    return out


# -- bytes per session ----------------------------------------------------------------------------


@dataclass
class Footprint:
    size: int
    calls: int
    tokens: int
    file_bytes: int
    used_bytes: int  # file less its free pages
    parts: dict[str, int]  # where the used bytes go


def footprint(session: Session, seed: int, workdir: Path) -> Footprint:
    path = workdir / f"size-{session.size}.db"
    stored = store_session(path, session.calls, seed)
    with sqlite3.connect(path) as conn:
        kinds = stored_bytes(conn)
        pages = dict(conn.execute("SELECT name, sum(pgsize) FROM dbstat GROUP BY name").fetchall())
        used = used_bytes(conn)
    conn.close()
    indexes = sum(v for k, v in pages.items() if k not in ("calls", "messages", "bodies", "meta", "sqlite_schema"))
    parts = {"token cols": stored.token_bytes, "request bodies": kinds["request bodies"],
             "canonical refs": kinds["canonical"], "messages": kinds["messages table"], "results": kinds["result"],
             "responses": kinds["response_body"], "indexes": indexes}
    return Footprint(session.size, len(session.calls), session.tokens, stored.file_bytes, used, parts)


def size_table(prints: list[Footprint]) -> Table:
    out = table("Capture store bytes per session by length (one session in its own database, its calls as the "
                "gateway writes them; used = file less free pages; parts are stored bytes, other = row and page "
                "overhead)", ["size", "calls", "tokens", "DB file", "free", "used", "used B/token", *prints[0].parts,
                              "other"], left=())
    for f in prints:
        other = f.used_bytes - sum(f.parts.values())
        out.add_row(size_label(f.size), str(f.calls), str(f.tokens), f"{f.file_bytes:,}",
                    f"{f.file_bytes - f.used_bytes:,}", f"{f.used_bytes:,}", f"{f.used_bytes / f.tokens:.1f}",
                    *(f"{v:,}" for v in f.parts.values()), f"{other:,}")
    return out


# -- command line -----------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> tuple[list[Rate], list[Footprint]]:
    ap = cli.parser(__doc__)
    ap.add_argument("--sessions", type=int, nargs="+", default=[1, 16, 256], help="concurrent sessions per row")
    cli.sync_arg(ap, ["FULL", "NORMAL"])
    ap.add_argument("--session-size", type=parse_size, default=parse_size("16k"),
                    help="tokens per replayed session in the write-rate table")
    ap.add_argument("--rows", type=int, default=3000, help="at least this many rows per write-rate cell")
    cli.session_args(ap, "session lengths for the bytes-per-session table (none: skip it)", nargs="*")
    cli.tokenizer_arg(ap, help="tokenizer dir")
    ap.add_argument("--dir", help="where the databases go (default: the temporary directory; its disk decides "
                                  "what an fsync costs)")
    cli.markdown_arg(ap, "tables")
    argv = list(sys.argv[1:] if argv is None else argv)
    args = ap.parse_args(argv)
    if min(args.sessions) < 1 or args.rows < 1:
        ap.error("--sessions and --rows must be at least 1")
    cli.check_sessions(ap, args)
    if args.dir and not Path(args.dir).is_dir():
        ap.error(f"--dir {args.dir} is not a directory")

    run = Run("bench_store.py", argv, dir=args.dir)
    synth = tokens.SessionSynth(ChatTemplate.from_dir(args.tokenizer), thinking=True, seed=args.seed)
    sessions: dict[int, Session] = {}

    def session_of(size: int) -> Session:
        if size not in sessions:
            sessions[size] = synthesize(synth, size, args.turns)
            run.progress(f"{size_label(size)} session synthesized at {time.perf_counter() - run.started:.0f} s")
        return sessions[size]

    with run:
        rated = session_of(args.session_size)
        rates = []
        for concurrency in args.sessions:
            for sync in args.sync:  # side by side, so a load spike hits both modes alike
                rates.append(write_rate(rated, sync, concurrency, args.rows, run.work))
                r = rates[-1]
                run.progress(f"{sync:<6} {concurrency:>3} sessions: {r.rows / r.wall:7.0f} rows/s")
        prints = [footprint(session_of(size), args.seed, run.work) for size in args.sizes]
    run.report([rate_table(rates, rated), *([size_table(prints)] if prints else [])],
               [f"databases in {run.work.parent} (its disk decides what an fsync costs)"], args.markdown)
    return rates, prints


if __name__ == "__main__":
    main()
