"""The capture store: one SQLite row per model call, durable before the client sees the answer.

One writer thread owns the write connection and commits in groups: under load many calls
share one fsync, at rest each call gets its own. Callers on the event loop enqueue work and
await a future that resolves once the transaction holding it has committed. A row is written
`pending` when the call arrives and completed when it ends, so a crash leaves the calls that
were in flight visible as such (`mark_interrupted` on the next start).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import queue
import sqlite3
import threading
import zlib
from collections import OrderedDict
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import numpy as np
import sqlite_utils

from polar.capture.tokens import PrefixIndex, as_ids, pack_logprobs, unpack_ids, unpack_logprobs

SCHEMA: dict[str, Any] = {
    "id": int,
    "call_id": str,  # public id: providers derive their response ids from it
    "session_id": str,
    "provider": str,
    "endpoint": str,
    "path": str,
    "model": str,  # as the client asked
    "upstream_model": str,
    "stream": int,
    "status": str,  # pending | ok | error | interrupted
    "http_status": int,
    "error_kind": str,
    "error": str,
    "client": str,
    "key_hash": str,  # salted hash of the client's API key; the key itself is never stored
    "request_headers": str,
    "request_body": bytes,
    "body_encoding": str,  # "zlib" when request_body is compressed
    "canonical": str,  # the canonical request (JSON), its messages as references into `messages`
    "result": str,  # the canonical result without token arrays (JSON)
    "response_body": bytes,
    "prompt_parent": int,  # row whose prompt+completion holds the first prompt_prefix_len ids
    "prompt_prefix_len": int,
    "prompt_suffix": bytes,
    "prompt_len": int,
    "completion_ids": bytes,
    "completion_logprobs": bytes,
    "completion_len": int,
    "finish_reason": str,
    "policy_version": str,
    "prompt_mode": str,  # how the prompt was built (chat-template | token-faithful …)
    "rewrites": str,  # JSON list: what the provider's parser changed or left out of the request
    "t_start": float,
    "t_upstream": float,  # seconds spent waiting for the upstream
    "t_end": float,
}

_STOP = object()


def _encode_body(row: dict[str, Any]) -> dict[str, Any]:
    """Compress the raw request body: it repeats the whole history on every turn."""
    body = row.get("request_body")
    if isinstance(body, (bytes, bytearray)) and len(body) > 1024:
        return {**row, "request_body": zlib.compress(body, 1), "body_encoding": "zlib"}
    return row


def _decode_row(conn: sqlite3.Connection, row: sqlite3.Row, messages: dict[str, Any]) -> dict[str, Any]:
    """A stored row as the caller sees it: JSON decoded, body decompressed, messages resolved."""
    out = dict(row)
    for key in ("request_headers", "canonical", "result"):
        if out.get(key):
            out[key] = json.loads(out[key])
    if out.get("body_encoding") == "zlib" and out.get("request_body"):
        out["request_body"] = zlib.decompress(out["request_body"])
    canonical = out.get("canonical")
    if isinstance(canonical, dict) and "message_refs" in canonical:
        refs = canonical.pop("message_refs")
        missing = [h for h in set(refs) if h not in messages]
        for start in range(0, len(missing), 500):
            chunk = missing[start : start + 500]
            marks = ",".join("?" * len(chunk))
            for digest, body in conn.execute(f"SELECT hash, body FROM messages WHERE hash IN ({marks})", chunk):
                messages[digest] = json.loads(body)
        canonical["messages"] = [messages[h] for h in refs]
    return out


def _sql_values(row: dict[str, Any]) -> list[Any]:
    for key in row:
        if key not in SCHEMA:  # column names come from code, never from clients: a typo is a bug
            raise KeyError(f"unknown capture column {key!r}")
    return list(row.values())
_EMPTY = np.zeros(0, dtype="<u4")
_RECENT_SESSIONS = 256  # sessions whose last messages the writer keeps (memory: one history each)


class CaptureStore:
    def __init__(self, path: str | Path, synchronous: str = "FULL", max_batch: int = 256, readonly: bool = False):
        self.path = str(path)
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._max_batch = max_batch
        self.prefixes = PrefixIndex()
        self._writer = None
        self._known_messages: dict[str, None] = {}  # insertion-ordered: a bounded memory of stored hashes
        # Writer-thread state: each pending row's session, and each recent session's last messages with
        # their hashes (a turn re-sends the whole history: unchanged messages are not re-serialised).
        self._pending_sessions: dict[int, str] = {}
        self._last_messages: OrderedDict[str, list[tuple[dict, str]]] = OrderedDict()
        if readonly:  # a reader beside a running proxy: no writer thread, no schema changes
            if not Path(self.path).exists():
                raise FileNotFoundError(f"no capture database at {self.path}")
            return
        Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        conn = self._connect()
        self._synchronous = synchronous.upper()
        conn.execute(f"PRAGMA synchronous={self._synchronous}")
        self._ensure_schema(sqlite_utils.Database(conn))
        self._presize_wal(conn)
        self._next_id = (conn.execute("SELECT max(id) FROM calls").fetchone()[0] or 0) + 1
        self._id_lock = threading.Lock()
        self._writer = threading.Thread(target=self._write_loop, args=(conn,), name="polar-capture-writer", daemon=True)
        self._writer.start()

    # -- setup ---------------------------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=30)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA busy_timeout=30000")
        return conn

    @staticmethod
    def _ensure_schema(db: sqlite_utils.Database) -> None:
        calls = db["calls"]
        if not calls.exists():
            calls.create(SCHEMA, pk="id", not_null={"call_id", "session_id", "status"}, defaults={"status": "pending"})
            calls.create_index(["call_id"], unique=True)
            calls.create_index(["session_id", "id"])
            calls.create_index(["status"])
        else:
            missing = {k: v for k, v in SCHEMA.items() if k not in calls.columns_dict}
            for name, typ in missing.items():  # additive migrations only
                calls.add_column(name, typ)
        if not db["messages"].exists():
            # Content-addressed canonical messages: every turn re-sends the whole history, but each
            # message is stored once, so a session's canonical requests take O(N), not O(T·N).
            db["messages"].create({"hash": str, "body": str}, pk="hash")
        if not db["meta"].exists():
            db["meta"].create({"key": str, "value": str}, pk="key")
            db["meta"].insert({"key": "key_salt", "value": os.urandom(16).hex()})

    def _presize_wal(self, conn: sqlite3.Connection) -> None:
        """Grow the WAL to its checkpoint size once, at start-up, instead of during the first captures.

        A commit that appends to the WAL changes the file's size, so its fsync must also flush file
        system metadata (0.8-2 ms per commit on this project's test VMs); a commit that overwrites
        WAL pages already written flushes data only (~0.4 ms). SQLite reuses the WAL from its start
        after each checkpoint, so once the file has reached the checkpoint size every commit
        overwrites: this takes the growth (~50 ms, ~4 MB of pages later reused) off the capture path.
        """
        page, pages = (conn.execute(f"PRAGMA {name}").fetchone()[0] for name in ("page_size", "wal_autocheckpoint"))
        wal = Path(self.path + "-wal")
        if pages <= 0 or (wal.exists() and wal.stat().st_size >= page * pages):
            return
        conn.execute("PRAGMA synchronous=NORMAL")  # scratch pages: no fsync needed for them
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("CREATE TABLE _polar_wal_presize (b BLOB)")
        conn.executemany("INSERT INTO _polar_wal_presize VALUES (zeroblob(?))", [(page - 64,)] * pages)
        conn.execute("DROP TABLE _polar_wal_presize")
        conn.execute("COMMIT")
        conn.execute("PRAGMA wal_checkpoint(PASSIVE)")  # never waits for readers; the next write restarts the WAL
        conn.execute(f"PRAGMA synchronous={self._synchronous}")

    def seal_key(self) -> bytes:
        """Key of the reasoning seals minted for this database's calls: random, made on first use
        and kept here, so seals survive restarts and one database's seals do not open in another."""
        conn = self._connect()
        try:
            conn.execute("INSERT OR IGNORE INTO meta (key, value) VALUES ('seal_key', ?)", (os.urandom(32).hex(),))
            return bytes.fromhex(conn.execute("SELECT value FROM meta WHERE key='seal_key'").fetchone()[0])
        finally:
            conn.close()

    def key_salt(self) -> bytes:
        """Salt for hashing client API keys; kept in the database so sessions survive restarts."""
        conn = self.reader()
        try:
            return bytes.fromhex(conn.execute("SELECT value FROM meta WHERE key='key_salt'").fetchone()[0])
        finally:
            conn.close()

    # -- writing ---------------------------------------------------------------------------

    def allocate_id(self) -> int:
        with self._id_lock:
            row_id = self._next_id
            self._next_id += 1
            return row_id

    def begin(self, row: dict[str, Any]) -> None:
        """Record an arriving call as pending. Not awaited: the final write is ordered after it."""
        self._submit(("insert", row))

    async def finish(self, row_id: int, fields: dict[str, Any]) -> None:
        """Complete a call's row and wait until it is committed."""
        await asyncio.wrap_future(self._submit(("update", row_id, fields)))

    def tokens_fields(self, session: str, row_id: int, prompt_ids, completion_ids, logprobs) -> dict[str, Any]:
        """Token columns for a call: the prompt as parent reference + suffix (linear storage)."""
        if not self.prefixes.knows(session):
            self._warm(session)
        prompt, completion = as_ids(prompt_ids), as_ids(completion_ids)  # converted once, used thrice
        ref = self.prefixes.split(session, prompt)
        self.prefixes.remember(session, row_id, prompt, completion)
        return {
            "prompt_parent": ref.parent_id,
            "prompt_prefix_len": ref.prefix_len,
            "prompt_suffix": ref.suffix,
            "prompt_len": len(prompt_ids),
            "completion_ids": completion.tobytes(),
            "completion_logprobs": pack_logprobs(logprobs),
            "completion_len": len(completion_ids),
        }

    def _warm(self, session: str) -> None:
        """After a restart, re-learn a session's recent lineages so its next prompt still links up."""
        reader = self.reader()
        rows = reader.execute(
            "SELECT id FROM calls WHERE session_id=? AND status='ok' AND completion_ids IS NOT NULL "
            "ORDER BY id DESC LIMIT ?",
            (session, self.prefixes.lineages),
        ).fetchall()
        for (row_id,) in reversed(rows):
            self.prefixes.remember(session, row_id, self.prompt_ids(row_id, reader), self.completion_ids(row_id, reader))
        reader.close()

    def _submit(self, op: tuple) -> Future:
        fut: Future = Future()
        self._queue.put((op, fut))
        return fut

    def _write_loop(self, conn: sqlite3.Connection) -> None:
        # Plain parameterised statements on the hot path: sqlite-utils' insert/update introspect
        # the table on every call (~15 statements per captured call); the schema is its job above.
        current_sync = self._synchronous
        while True:
            batch = [self._queue.get()]
            while len(batch) < self._max_batch:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            stop = any(op is _STOP for op, _ in batch)
            work = [(op, fut) for op, fut in batch if op is not _STOP]
            error: BaseException | None = None
            # Only completions are awaited by clients, so only they pay for an fsync; a batch of
            # arrivals alone commits without one (still safe against the proxy being killed).
            durable = self._synchronous if any(op[0] == "update" for op, _ in work) else "NORMAL"
            try:
                if durable != current_sync:
                    conn.execute(f"PRAGMA synchronous={durable}")
                    current_sync = durable
                conn.execute("BEGIN IMMEDIATE")
                for op, _ in work:
                    if op[0] == "insert":
                        row = _encode_body(op[1])
                        self._pending_sessions[row["id"]] = row["session_id"]
                        conn.execute(f"INSERT INTO calls ({', '.join(row)}) VALUES ({', '.join('?' * len(row))})",
                                     _sql_values(row))
                    else:
                        fields = self._encode_canonical(conn, self._pending_sessions.pop(op[1], None), op[2])
                        conn.execute(f"UPDATE calls SET {', '.join(f'{k}=?' for k in fields)} WHERE id=?",
                                     [*_sql_values(fields), op[1]])
                conn.execute("COMMIT")
            except BaseException as exc:  # a failed batch must not kill the writer
                error = exc
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                # The rolled-back batch may have stored messages these memories now think are there.
                self._known_messages.clear()
                self._last_messages.clear()
            for _, fut in batch:
                if error is None:
                    fut.set_result(None)
                else:
                    fut.set_exception(error)
            if stop:
                conn.close()
                return

    def _encode_canonical(self, conn: sqlite3.Connection, session: str | None, fields: dict[str, Any]) -> dict[str, Any]:
        """Store the canonical request's messages content-addressed; keep references in the row."""
        canonical = fields.get("canonical")
        if not isinstance(canonical, dict):
            return fields
        messages = canonical.get("messages", [])
        last = self._last_messages.get(session, []) if session else []
        refs = []
        for i, message in enumerate(messages):
            if i < len(last) and last[i][0] == message:  # a C-level comparison, no JSON encoding or hashing
                refs.append(last[i][1])
                continue
            body = json.dumps(message, ensure_ascii=False, sort_keys=True, separators=(",", ":"))
            digest = hashlib.blake2b(body.encode(), digest_size=16).hexdigest()
            if digest not in self._known_messages:
                conn.execute("INSERT OR IGNORE INTO messages (hash, body) VALUES (?, ?)", (digest, body))
                self._known_messages[digest] = None
                if len(self._known_messages) > 200_000:
                    self._known_messages.pop(next(iter(self._known_messages)))
            refs.append(digest)
        if session:
            self._last_messages[session] = list(zip(messages, refs))
            self._last_messages.move_to_end(session)
            while len(self._last_messages) > _RECENT_SESSIONS:
                self._last_messages.popitem(last=False)
        rest = {k: v for k, v in canonical.items() if k != "messages"}
        return {**fields, "canonical": json.dumps({**rest, "message_refs": refs}, ensure_ascii=False)}

    def close(self) -> None:
        writer, self._writer = self._writer, None  # a second close is a no-op
        if writer is not None and writer.is_alive():
            self._submit(_STOP).result(timeout=60)
            writer.join(timeout=60)

    def mark_interrupted(self) -> int:
        """Calls still pending from an earlier process can never finish: say so. Returns how many."""
        conn = self._connect()
        try:
            cur = conn.execute(
                "UPDATE calls SET status='interrupted', error='the proxy stopped before this call finished', "
                "error_kind='interrupted' WHERE status='pending'"
            )
            return cur.rowcount
        finally:
            conn.close()

    # -- reading -----------------------------------------------------------------------------

    def reader(self) -> sqlite3.Connection:
        conn = self._connect()
        conn.row_factory = sqlite3.Row
        return conn

    def prompt_ids(self, row_id: int, conn: sqlite3.Connection | None = None, _memo: dict | None = None) -> list[int]:
        """Resolve a call's full prompt by following its parent references.

        `_memo` maps row id → that row's prompt+completion (numpy), so reading a whole session
        resolves each row once.
        """
        own = conn is None
        conn = conn or self.reader()
        memo = _memo if _memo is not None else {}
        try:
            chain: list[tuple[int, int, bytes, bytes]] = []
            cur: int | None = row_id
            while cur is not None and cur not in memo:
                parent, prefix_len, suffix, completion = conn.execute(
                    "SELECT prompt_parent, prompt_prefix_len, prompt_suffix, completion_ids FROM calls WHERE id=?",
                    (cur,),
                ).fetchone()
                chain.append((cur, prefix_len or 0, suffix or b"", completion or b""))
                cur = parent if prefix_len else None
            for rid, prefix_len, suffix, completion in reversed(chain):
                head = memo[cur][:prefix_len] if cur is not None else _EMPTY
                memo[rid] = np.concatenate([head, np.frombuffer(suffix, "<u4"), np.frombuffer(completion, "<u4")])
                cur = rid
            (completion,) = conn.execute("SELECT completion_len FROM calls WHERE id=?", (row_id,)).fetchone()
            seq = memo[row_id]
            return seq[: len(seq) - (completion or 0)].tolist()
        finally:
            if own:
                conn.close()

    def find_call(self, call_id: str, session: str) -> dict[str, Any] | None:
        """A finished call by its public id, only within the asking session."""
        conn = self.reader()
        try:
            row = conn.execute(
                "SELECT * FROM calls WHERE call_id=? AND session_id=? AND status='ok'", (call_id, session)
            ).fetchone()
            return _decode_row(conn, row, {}) if row else None
        finally:
            conn.close()

    @staticmethod
    def completion_ids(row_id: int, conn: sqlite3.Connection) -> list[int]:
        (blob,) = conn.execute("SELECT completion_ids FROM calls WHERE id=?", (row_id,)).fetchone()
        return unpack_ids(blob)

    def calls(self, session: str | None = None, with_tokens: bool = True) -> Iterator[dict[str, Any]]:
        """Rows as dicts, oldest first, with token columns decoded into lists."""
        conn = self.reader()
        memo: dict[int, list[int]] = {}
        try:
            sql = "SELECT * FROM calls" + (" WHERE session_id=?" if session else "") + " ORDER BY id"
            messages: dict[str, Any] = {}
            for row in conn.execute(sql, (session,) if session else ()).fetchall():
                out = _decode_row(conn, row, messages)
                if with_tokens:
                    out["completion_ids"] = unpack_ids(row["completion_ids"])
                    out["completion_logprobs"] = unpack_logprobs(row["completion_logprobs"])
                    out["prompt_ids"] = self.prompt_ids(row["id"], conn, memo) if row["prompt_len"] is not None else []
                yield out
        finally:
            conn.close()

