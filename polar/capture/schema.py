"""The capture database's shape: one `calls` row per model call, content-addressed messages, meta.

Only the writer creates or migrates it (columns added; one column retyped: `policy_version`, see
`_retype_policy_version`); readers open it read-only, and read the layouts before it (reader.py).
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from typing import Any

import sqlite_utils

CALLS: dict[str, Any] = {
    "id": int,
    "call_id": str,  # public id: providers derive their response ids from it
    "session_id": str,
    "writer": str,  # the gateway process that owns a pending row (see writer leases)
    "provider": str,
    "endpoint": str,
    "path": str,
    "model": str,  # as the client asked
    "upstream_model": str,
    "stream": int,
    "status": str,  # pending | ok | error | interrupted | client_disconnected
    "http_status": int,
    "error_kind": str,
    "error": str,
    "client": str,
    "key_hash": str,  # salted hash of the client's API key; the key itself is never stored
    "request_headers": str,  # JSON, as the JSON columns below
    "request_body": bytes,
    "body_encoding": str,  # where and how the request body is: NULL (as is), zlib, zstd, zstd-delta, zstd-splice
    "body_id": int,  # zstd, zstd-delta, zstd-splice: the body's row in `bodies` (bodies.py)
    # JSON columns: the text, or (a BLOB) that text zstd-compressed when over 256 B (bodies.pack_json)
    "canonical": str,  # the canonical request (JSON), its messages and large parts as references into `messages`
    "rewrites": str,  # JSON list: what polar changed in the request so the template accepts it, and why
    "result": str,  # the canonical result without token arrays (JSON)
    "response_body": bytes,
    # NULL (as is) or zstd (bodies.pack) in `response_body`; or, over bodies.ANSWER_APART, in the `bodies` table
    # (row `response_body_id`) as zstd or zstd-splice against the session's earlier answers, like request bodies
    "response_encoding": str,
    "response_body_id": int,
    "prompt_parent": int,  # row whose prompt+completion holds the first prompt_prefix_len ids
    "prompt_prefix_len": int,
    "prompt_suffix": bytes,  # uint32 ids: as they are, or zstd (bodies.pack) when over 256 B
    "prompt_encoding": str,  # NULL or zstd: a turn's new ids (tool output, files) compress ~3x
    "prompt_len": int,
    "completion_ids": bytes,
    "completion_logprobs": bytes,  # NULL when the upstream returned none (never invented zeros)
    "completion_encoding": str,  # NULL or zstd (bodies.pack, both columns) when over 256 B: ids compress ~2x
    "completion_len": int,
    "finish_reason": str,
    "policy_version": int,  # the trainer's step the gate resumed under (gateway/gate.py)
    "weight_version": str,  # the upstream's own label for the weights that sampled the call (vLLM's)
    "prompt_mode": str,  # how the prompt was built (chat-template | token-faithful | re-render: why)
    "replica": str,  # base URL of the fleet replica that answered or failed the call (NULL: one upstream)
    "t_start": float,
    "t_upstream": float,  # seconds spent waiting for the upstream
    "t_first": float,  # streamed answers: when the first piece of the answer was sent (time to first token)
    "t_end": float,
}


BODIES: dict[str, Any] = {"id": int, "base": int, "data": bytes, "head": int, "tail": int, "lookback": int}


def connect(path: str | Path, synchronous: str = "FULL", busy_timeout: float = 30.0) -> sqlite3.Connection:
    """The writer's connection: WAL, autocommit (transactions are explicit), shared across threads.
    `busy_timeout`: seconds a write waits for another process's lock before failing "database is locked"."""
    conn = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False, timeout=busy_timeout)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(f"PRAGMA busy_timeout={int(busy_timeout * 1000)}")
    conn.execute(f"PRAGMA synchronous={synchronous}")
    return conn


def ensure(conn: sqlite3.Connection) -> None:
    db = sqlite_utils.Database(conn)
    calls = db["calls"]
    if not calls.exists():
        calls.create(CALLS, pk="id", not_null={"call_id", "session_id", "status"}, defaults={"status": "pending"})
        calls.create_index(["call_id"], unique=True)
        calls.create_index(["session_id", "id"])
        calls.create_index(["status"])
    else:
        for name, typ in CALLS.items():
            if name not in calls.columns_dict:
                calls.add_column(name, typ)
        _retype_policy_version(conn, calls)
    if not db["messages"].exists():
        # Content-addressed canonical messages (and large request parts, the tools): every turn re-sends
        # them all, but each is stored once, so a session's canonical requests take O(N), not O(T·N).
        # `body` is the JSON text, or (a BLOB) that text zstd-compressed when large (bodies.pack_json).
        db["messages"].create({"hash": str, "body": str}, pk="hash")
    # Large request and response bodies, each zstd-compressed against its `base` body (NULL: a keyframe); a
    # splice (`head` set) stores only what lies between the bytes it shares with its base at each end.
    # Append-only, apart from calls, so deleting a call's row leaves every other body readable.
    bodies = db["bodies"]
    if not bodies.exists():
        bodies.create(BODIES, pk="id")
    else:
        for name, typ in BODIES.items():
            if name not in bodies.columns_dict:
                bodies.add_column(name, typ)
    if not db["dictionaries"].exists():
        # zstd dictionaries trained on this database's own small values (dictionaries.py); each value names
        # the one it was compressed with in its zstd frame. Never changed or deleted once stored.
        db["dictionaries"].create({"id": int, "kind": str, "data": bytes, "t_created": float}, pk="id")
    if not db["meta"].exists():
        db["meta"].create({"key": str, "value": str}, pk="key")
    for key in ("key_salt", "seal_key"):  # secrets of this database, random per database
        conn.execute("INSERT OR IGNORE INTO meta (key, value) VALUES (?, ?)", (key, os.urandom(32).hex()))


def policy_step(stored: Any) -> int | None:
    """The trainer's step in a `policy_version` as databases before it was an int hold it (TEXT: the step's digits,
    or the upstream's label for its weights, such as vLLM's "default"); None for a label."""
    if isinstance(stored, int) or stored is None:
        return stored
    try:
        step = int(stored)
    except ValueError:
        return None
    return step if str(step) == stored else None


def _retype_policy_version(conn: sqlite3.Connection, calls: sqlite_utils.db.Table) -> None:
    """A database from before `policy_version` was an int: the column becomes INTEGER (the table is rebuilt,
    once), a step keeps its value as the int, and a label moves to `weight_version`: nothing captured is lost."""
    if calls.columns_dict["policy_version"] is int:
        return
    conn.execute("BEGIN IMMEDIATE")
    try:
        if calls.columns_dict["policy_version"] is not int:  # another writer may have done it meanwhile
            conn.create_function("polar_policy_step", 1, policy_step, deterministic=True)
            conn.execute("UPDATE calls SET weight_version = policy_version, policy_version = NULL"
                         " WHERE policy_version IS NOT NULL AND polar_policy_step(policy_version) IS NULL")
            calls.transform(types={"policy_version": int})  # the digits left become ints (INTEGER affinity)
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def presize_wal(conn: sqlite3.Connection, path: str, synchronous: str) -> None:
    """Grow the WAL to its checkpoint size once, at start-up, instead of during the first captures.

    A commit that appends to the WAL changes the file's size, so its fsync must also flush file
    system metadata, several times the cost of a commit that overwrites WAL pages already
    written and flushes data only. SQLite reuses the WAL from its start after each checkpoint, so
    once the file has reached the checkpoint size every commit overwrites: this takes the growth
    (~4 MB of pages, later reused) off the capture path.
    """
    page, pages = (conn.execute(f"PRAGMA {name}").fetchone()[0] for name in ("page_size", "wal_autocheckpoint"))
    wal = Path(path + "-wal")
    if pages <= 0 or (wal.exists() and wal.stat().st_size >= page * pages):
        return
    conn.execute("PRAGMA synchronous=NORMAL")  # scratch pages: no fsync needed for them
    conn.execute("BEGIN IMMEDIATE")
    conn.execute("CREATE TABLE IF NOT EXISTS _polar_wal_presize (b BLOB)")
    conn.executemany("INSERT INTO _polar_wal_presize VALUES (zeroblob(?))", [(page - 64,)] * pages)
    conn.execute("DROP TABLE _polar_wal_presize")
    conn.execute("COMMIT")
    conn.execute("PRAGMA wal_checkpoint(PASSIVE)")  # never waits for readers; the next write restarts the WAL
    conn.execute(f"PRAGMA synchronous={synchronous}")


# Where a capture database's bytes go, as the benchmarks break it down: kind → SQL summing its stored bytes
# (or SQL for this schema, then for an older one).
STORED_BYTES: dict[str, str | tuple[str, ...]] = {
    # Every `bodies` row that is not an answer, so a base whose call was deleted still counts.
    "request bodies": ("SELECT (SELECT coalesce(sum(length(request_body)), 0) FROM calls)"
                       " + (SELECT coalesce(sum(length(data)), 0) FROM bodies WHERE id NOT IN"
                       " (SELECT response_body_id FROM calls WHERE response_body_id IS NOT NULL))",
                       "SELECT (SELECT coalesce(sum(length(request_body)), 0) FROM calls)"
                       " + (SELECT coalesce(sum(length(data)), 0) FROM bodies)"),  # before response_body_id
    "canonical": "SELECT coalesce(sum(length(canonical)), 0) FROM calls",
    "response_body": ("SELECT (SELECT coalesce(sum(length(response_body)), 0) FROM calls)"
                      " + (SELECT coalesce(sum(length(data)), 0) FROM bodies WHERE id IN (SELECT response_body_id FROM calls))",
                      "SELECT coalesce(sum(length(response_body)), 0) FROM calls"),  # before response_body_id
    "result": "SELECT coalesce(sum(length(result)), 0) FROM calls",
    "token columns": "SELECT coalesce(sum(length(prompt_suffix) + length(completion_ids)"
                     " + coalesce(length(completion_logprobs), 0)), 0) FROM calls",
    "messages table": "SELECT coalesce(sum(length(body)), 0) FROM messages",
    "request headers": "SELECT coalesce(sum(length(request_headers)), 0) FROM calls",
    "dictionaries": "SELECT coalesce(sum(length(data)), 0) FROM dictionaries",
}


def stored_bytes(conn: sqlite3.Connection) -> dict[str, int]:
    """Bytes stored of each kind in STORED_BYTES (row and page overhead not included; a kind whose table an
    older database has not: 0)."""
    out = {}
    for kind, sql in STORED_BYTES.items():
        out[kind] = 0
        for query in (sql,) if isinstance(sql, str) else sql:
            try:
                out[kind] = conn.execute(query).fetchone()[0]
                break
            except sqlite3.OperationalError:  # no such table or column
                continue
    return out


def secret(conn: sqlite3.Connection, key: str) -> bytes:
    """A per-database secret from `meta` (the key salt for API-key hashes, the reasoning seal key)."""
    row = conn.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
    if row is None:
        raise KeyError(f"capture database has no {key!r}; open it once with the writer")
    return bytes.fromhex(row[0])
