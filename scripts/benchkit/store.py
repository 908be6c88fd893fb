"""The capture store in process: a real CaptureWriter (polar/capture/writer.py) given calls exactly as the gateway
hands them over (the pending row, then the completion with its token columns, awaited until committed), and the
bytes a database holds. For the benchmarks that measure the store without the proxy in front of it."""

from __future__ import annotations

import asyncio
import random
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchkit.targets import REPO  # noqa: F401  (puts the repository on sys.path too)
from polar.capture.reader import CaptureReader
from polar.capture.records import CallEnd, CallStart, TokenRecord, encode_messages
from polar.capture.schema import stored_bytes
from polar.capture.writer import CaptureWriter
from polar.sessions.state import SessionState, Turn


@dataclass
class GatewayCall:
    """One call as the gateway hands it to the capture store (ids, session and clock filled in at write time)."""

    begin: dict[str, Any]  # the pending row's fields (CallStart)
    finish: dict[str, Any]  # the completion's fields (CallEnd), without its token columns
    prompt: list[int]
    sampled: list[int]
    logprobs: list[float]


async def write_call(writer: CaptureWriter, state: SessionState, session: str, call: GatewayCall, call_id: str,
                     canonical: dict[str, Any] | None = None) -> None:
    """Write one call as the gateway does: the pending row, then the completion (its prompt stored against
    the session's earlier sequences, its messages by reference), awaited until committed; then remember it."""
    start = CallStart(call_id=call_id, session_id=session, client=None, key_hash=None, t_start=time.time(), **call.begin)
    arrival = writer.start(start)
    end = CallEnd(**{**call.finish, **({"canonical": canonical} if canonical is not None else {})}, t_end=time.time())
    end.messages = encode_messages(end.canonical["messages"], state.messages)
    end.tokens = TokenRecord(call.prompt, call.sampled, call.logprobs, state.lineage(call.prompt))
    row_id = await writer.finish(arrival, end)
    state.messages = end.messages.log(row_id, end.canonical["messages"])
    state.add(Turn(row_id, state.branch_point(call.prompt).hold(call.prompt, call.sampled), len(call.prompt), "", [],
                   ""), keep=16)


@dataclass
class Stored:
    token_bytes: int  # prompt suffixes + completion ids + completion logprobs
    full_bytes: int  # the same columns if every prompt were stored whole
    text_bytes: int  # request bodies, canonical requests, results, response bodies, stored messages
    file_bytes: int  # the database file(s) after closing
    rows: list[dict[str, Any]]


def store_session(path: Path, calls: list[GatewayCall], seed: int) -> Stored:
    """Write one session's calls as the gateway does (one row each, tokens linear) and read them back."""
    rng = random.Random(seed)
    writer, state = CaptureWriter(path, synchronous="NORMAL"), SessionState()

    async def write() -> None:
        for call in calls:
            await write_call(writer, state, "bench", call, f"{rng.getrandbits(96):024x}")

    asyncio.run(write())
    writer.close()
    with sqlite3.connect(path) as conn:
        stored = stored_bytes(conn)
        (full_ids,) = conn.execute("SELECT sum(prompt_len + 2 * completion_len) FROM calls").fetchone()
    conn.close()
    token_bytes = stored.pop("token columns")
    text_bytes = sum(stored.values())
    rows = list(CaptureReader(path).calls(session="bench"))
    file_bytes = sum(p.stat().st_size for p in path.parent.glob(path.name + "*"))
    return Stored(token_bytes, 4 * full_ids, text_bytes, file_bytes, rows)


def used_bytes(conn: sqlite3.Connection) -> int:
    """Pages in use: the file less its free list (the store pre-sizes its WAL with scratch pages that end
    up free in the database file, ~4 MB reused by later rows)."""
    count, free, page = (conn.execute(f"PRAGMA {name}").fetchone()[0] for name in
                         ("page_count", "freelist_count", "page_size"))
    return (count - free) * page
