#!/usr/bin/env python3
"""Benchmark: capture storage at the agent shape — whole-DB bytes per unique token, before and after.

Driven through the real gateway path: `polar proxy` (token-faithful, the real capture writer) in front
of scripts/bench_upstream.py (the scripted vLLM double, real tokenizer) whose script answers every
turn with reasoning, a short text and a tool call. --sessions clients (16) each play a Claude Code
session over Anthropic Messages, streamed: the first request is shaped like a real Claude Code one
(a ~18 KB system prompt in blocks, 12 tools with JSON schemas ~50 KB, thinking enabled, metadata,
~89 KB in all), then --turns turns (30), each appending the answer the client received (thinking +
text + tool_use, as streamed) and a ~2 KB tool_result. So what is measured is what polar writes.
All sessions start at once unless --concurrency caps them (then one starts as another ends, as in a
rollout; a session's first body can then be stored against an earlier session's, see bodies.py).

"unique tokens" = the sum over sessions of the final context (last call's prompt + completion).
AFTER is the database polar wrote. BEFORE is the same rows in the earlier encoding — every request
body zlib-compressed whole, the canonical request with its tools inline, response bodies, results,
messages and prompt ids uncompressed — computed from AFTER's rows (each read back through
CaptureReader) into a copy. Both are measured after VACUUM.
Every body is also checked to read back byte for byte as the client sent it, and reading is timed:
every row in order, and each row alone (the longest delta chain bounds the latter).

    python scripts/bench_storage.py [--sessions 16] [--turns 30] [--concurrency N] [--tokenizer DIR] [--dir DIR]
                                    [--markdown]
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
import sqlite3
import sys
import time
import zlib
from contextlib import closing
from pathlib import Path
from typing import Any

import httpx
from rich.table import Table

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from benchkit import args as cli  # noqa: E402
from benchkit.replay import blocks_of, prose, tool_output  # noqa: E402
from benchkit.report import Run, table  # noqa: E402
from benchkit.targets import ANTHROPIC_HEADERS, start_polar, start_upstream  # noqa: E402

from polar.capture.bodies import unpack, unpack_json  # noqa: E402
from polar.capture.dictionaries import Dictionaries  # noqa: E402
from polar.capture.reader import CaptureReader  # noqa: E402
from polar.capture.records import stored_message  # noqa: E402
from polar.capture.schema import STORED_BYTES, stored_bytes  # noqa: E402


def tools(rng: random.Random) -> list[dict[str, Any]]:
    """12 tools with JSON schemas, ~50 KB, as Claude Code declares them."""
    names = ["Task", "Bash", "Glob", "Grep", "LS", "Read", "Edit", "MultiEdit", "Write", "WebFetch", "TodoWrite",
             "WebSearch"]
    out = []
    for name in names:
        props = {f"{name.lower()}_{k}": {"type": rng.choice(["string", "number", "boolean"]),
                                         "description": prose(rng, 180)} for k in range(6)}
        out.append({"name": name, "description": prose(rng, 3000),
                    "input_schema": {"type": "object", "properties": props, "required": list(props)[:2],
                                     "additionalProperties": False,
                                     "$schema": "http://json-schema.org/draft-07/schema#"}})
    return out


def first_request(rng: random.Random, session: int) -> dict[str, Any]:
    system = [{"type": "text", "text": "You are Claude Code, Anthropic's official CLI for Claude."},
              {"type": "text", "text": prose(rng, 18_000), "cache_control": {"type": "ephemeral"}}]
    task = prose(random.Random(f"task {session}"), 1500)
    reminder = "<system-reminder>\n" + prose(rng, 12_000) + "\n</system-reminder>"
    return {"model": "claude-sonnet-4-5", "max_tokens": 32000, "system": system, "tools": tools(rng),
            "thinking": {"type": "enabled", "budget_tokens": 8000},
            "metadata": {"user_id": f"user_bench_account_session_{session:04d}"}, "stream": True,
            "messages": [{"role": "user", "content": [{"type": "text", "text": reminder},
                                                      {"type": "text", "text": task}]}]}


def script(turns: int) -> dict[str, Any]:
    """The double's answers: every turn thinks, says a line and calls a tool."""
    rng = random.Random("answers")
    steps = [{"reasoning": prose(rng, 400), "content": prose(rng, 150),
              "tool_calls": [{"name": "Bash", "arguments": {"command": f"pytest -x tests/test_{t}.py -k case_{t}",
                                                            "description": prose(rng, 60)}}]}
             for t in range(turns)]
    return {"rules": [{"match": None, "steps": steps}]}


# -- the client ------------------------------------------------------------------------------------


async def play(client: httpx.AsyncClient, url: str, session: int, turns: int, sent: list[str]) -> None:
    body = first_request(random.Random("claude code"), session)
    headers = {**ANTHROPIC_HEADERS, "x-polar-session": f"bench-{session:02d}"}
    for turn in range(turns):
        raw = json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()
        resp = await client.post(url, content=raw, headers=headers)
        if resp.status_code != 200 or b"event: error" in resp.content:
            raise RuntimeError(f"session {session} turn {turn}: HTTP {resp.status_code}: {resp.text[:500]}")
        sent.append(hashlib.sha256(raw).hexdigest())
        answer = blocks_of(resp.content)
        uses = [b for b in answer if b["type"] == "tool_use"]
        body["messages"] += [{"role": "assistant", "content": answer},
                             {"role": "user", "content": [{"type": "tool_result", "tool_use_id": u["id"],
                                                           "content": tool_output(session, turn)} for u in uses]}]


async def drive(url: str, sessions: int, turns: int, concurrency: int) -> dict[str, list[str]]:
    """All sessions, at most `concurrency` at a time (a new one starts when one ends, as in a rollout)."""
    sent: dict[str, list[str]] = {f"bench-{s:02d}": [] for s in range(sessions)}
    slots = asyncio.Semaphore(concurrency)

    async def one(client: httpx.AsyncClient, s: int) -> None:
        async with slots:
            await play(client, url, s, turns, sent[f"bench-{s:02d}"])

    async with httpx.AsyncClient(timeout=600) as client:
        await asyncio.gather(*(one(client, s) for s in range(sessions)))
    return sent


# -- measuring -------------------------------------------------------------------------------------

def measure(path: Path) -> dict[str, int]:
    """Bytes of a VACUUMed copy, and where they go."""
    packed = path.with_suffix(".vacuumed.db")
    packed.unlink(missing_ok=True)
    with closing(sqlite3.connect(path)) as conn:
        conn.execute("VACUUM INTO ?", (str(packed),))
        out = stored_bytes(conn)
    out["whole DB"] = packed.stat().st_size
    packed.unlink()
    return out


def unique_tokens(path: Path) -> int:
    """Sum over sessions of the final context: the last call's prompt + completion."""
    with closing(sqlite3.connect(path)) as conn:
        return conn.execute(
            "SELECT sum(prompt_len + completion_len) FROM calls WHERE id IN "
            "(SELECT max(id) FROM calls WHERE status = 'ok' AND prompt_len IS NOT NULL GROUP BY session_id)"
        ).fetchone()[0]


def old_format(src: Path, dst: Path) -> None:
    """`src`'s rows as the earlier writer stored them: request bodies zlib-compressed whole (as they are
    when small), large canonical parts inline and every message reference listed in each row,
    responses, results, messages, headers and prompt ids as they are (no dictionaries)."""
    dst.unlink(missing_ok=True)
    with closing(sqlite3.connect(src)) as conn:
        conn.execute("VACUUM INTO ?", (str(dst),))
    rows = {r["id"]: r for r in CaptureReader(src).calls(with_tokens=False)}
    with closing(sqlite3.connect(dst)) as conn:
        dictionaries = Dictionaries(conn)

        def text(value: str | bytes) -> str:
            """A JSON column's text, however it is stored."""
            value = unpack_json(value, dictionaries)
            return value if isinstance(value, str) else value.decode()

        values = {digest: text(body) for digest, body in conn.execute("SELECT hash, body FROM messages")}
        conn.executemany("UPDATE messages SET body=? WHERE hash=?", [(v, k) for k, v in values.items()])
        parts: set[str] = set()
        for row_id, stored, result in conn.execute("SELECT id, canonical, result FROM calls").fetchall():
            body = rows[row_id]["request_body"] or b""
            zipped = len(body) > 1024  # the earlier rule: zlib above 1 KB, as it is below
            canonical = None
            if stored:
                canonical = json.loads(text(stored))
                canonical.pop("message_base", None)  # every reference listed in every row
                canonical["message_refs"] = [stored_message(m).digest for m in rows[row_id]["canonical"]["messages"]]
                for key in canonical.pop("part_refs", []):
                    parts.add(canonical[key])
                    canonical[key] = json.loads(values[canonical[key]])
                canonical = json.dumps(canonical, ensure_ascii=False)
            conn.execute("UPDATE calls SET request_body=?, body_encoding=?, body_id=NULL, canonical=?, result=?, "
                         "response_body=?, response_encoding=NULL, response_body_id=NULL, request_headers=? WHERE id=?",
                         (zlib.compress(body, 1) if zipped else body, "zlib" if zipped else None, canonical,
                          result and text(result), rows[row_id]["response_body"],
                          json.dumps(rows[row_id]["request_headers"]), row_id))
        suffixes = conn.execute("SELECT id, prompt_suffix, prompt_encoding FROM calls WHERE prompt_encoding IS NOT NULL")
        conn.executemany("UPDATE calls SET prompt_suffix=?, prompt_encoding=NULL WHERE id=?",
                         [(unpack(suffix, encoding, "a prompt suffix"), row_id) for row_id, suffix, encoding in suffixes])
        conn.executemany("DELETE FROM messages WHERE hash=?", [(h,) for h in parts])
        conn.execute("DELETE FROM bodies")
        conn.execute("DELETE FROM dictionaries")
        conn.commit()


def check_bodies(path: Path, sent: dict[str, list[str]]) -> None:
    got: dict[str, list[str]] = {s: [] for s in sent}
    for row in CaptureReader(path).calls(with_tokens=False):
        got[row["session_id"]].append(hashlib.sha256(row["request_body"]).hexdigest())
    if got != sent:
        raise RuntimeError("a stored request body does not read back as the client sent it")


def read_times(path: Path) -> str:
    """Seconds to read every row (bodies rebuilt, canonical resolved), and the slowest row read alone."""
    reader = CaptureReader(path)
    t0 = time.perf_counter()
    rows = [(r["call_id"], r["session_id"]) for r in reader.calls(with_tokens=False)]
    scan = time.perf_counter() - t0
    worst = 0.0
    for call_id, session in rows:
        t0 = time.perf_counter()
        reader.find_call(call_id, session)
        worst = max(worst, time.perf_counter() - t0)
    return f"every row {scan:.2f} s, one row alone at most {worst * 1000:.1f} ms"


def results_table(before: dict[str, int], after: dict[str, int], tokens: int) -> Table:
    out = table(f"Capture storage, {tokens:,} unique tokens", ("", "before: bytes", "B/token", "after: bytes", "B/token"),
                left=("",))
    for name in ("whole DB", *STORED_BYTES):
        out.add_row(name, f"{before[name]:,}", f"{before[name] / tokens:.2f}", f"{after[name]:,}",
                    f"{after[name] / tokens:.2f}")
    return out


def main(argv: list[str] | None = None) -> tuple[dict[str, int], dict[str, int], int]:
    """(before, after, unique tokens)."""
    ap = cli.parser(__doc__)
    ap.add_argument("--sessions", type=int, default=16)
    ap.add_argument("--turns", type=int, default=30)
    ap.add_argument("--concurrency", type=int, default=0, help="sessions at a time (default: all at once)")
    cli.tokenizer_arg(ap)
    ap.add_argument("--dir", type=Path, help="keep the databases and logs here (default: a temporary directory)")
    cli.markdown_arg(ap)
    argv = list(sys.argv[1:] if argv is None else argv)
    args = ap.parse_args(argv)
    with Run("bench_storage.py", argv, width=200, keep=args.dir) as run:
        work = run.work
        (work / "script.json").write_text(json.dumps(script(args.turns)))
        upstream = run.start(start_upstream(work, args.tokenizer, ["--script", str(work / "script.json"),
                                                                   "--max-model-len", "262144"]))
        proxy = run.start(start_polar(work, upstream, "NORMAL", args.tokenizer))
        sent = asyncio.run(drive(f"{proxy.health_url}v1/messages", args.sessions, args.turns,
                                 args.concurrency or args.sessions))
        run.stop()  # the database whole, its writer gone
        db = work / "captures-normal-tokens.db"
        check_bodies(db, sent)
        old_format(db, work / "captures-before.db")
        before, after, tokens = measure(work / "captures-before.db"), measure(db), unique_tokens(db)
        reads = f"reading, before: {read_times(work / 'captures-before.db')}; after: {read_times(db)}"
    run.report(results_table(before, after, tokens), [reads], args.markdown)
    return before, after, tokens


if __name__ == "__main__":
    main()
