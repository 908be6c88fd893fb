"""The capture writer: one SQLite row per model call, committed before the client sees the answer.

One thread owns the write connection and commits in groups: under load many calls share one
fsync, at rest each call gets its own. An arrival is queued and not waited for (`start` returns an
`Arrival` the writer thread fills in); a completion is awaited: its future resolves once the
transaction holding it has committed — or raises `CaptureError`, so a call whose capture failed never
answers as if it had been recorded. The writer wakes each waiting event loop once per group, not
once per write: a thread hand-off costs a small call more than its SQL does.

No call's row depends on another call's statement: each write runs in its own SAVEPOINT, so a
statement that fails rolls back that write alone; if the group's COMMIT fails (disk full, I/O
error), every write is retried in a transaction of its own; if the transaction cannot even begin
(another process holds the lock past `busy_timeout`), the group fails at once, not once per write.
Completing a call whose arrival row is missing inserts the row whole.

SQLite in WAL mode keeps writing, without an error, to a database file deleted or replaced under it:
the writer checks that its path still names the file it opened and otherwise fails every write.

Several gateways may write one database (an option change, N processes per node). Each writer holds
a lease (an flock on `<db>.writers/<token>`) and tags the rows it opens, so on start-up only the
pending rows of writers that died are marked interrupted, never a live gateway's.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import logging
import os
import queue
import secrets
import sqlite3
import threading
from collections import defaultdict
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from polar.capture import schema
from polar.capture.bodies import ANSWER_APART, BodyBases, store, write_body
from polar.capture.dictionaries import Packer
from polar.capture.records import CallEnd, CallStart
from polar.capture.shards import first_row_id

log = logging.getLogger("polar.capture")

_STOP = object()


class CaptureError(RuntimeError):
    """A capture write did not commit; the message says why (disk full, I/O error, …)."""


@dataclass
class Arrival:
    """A call as `start` queued it. `row_id` is its pending row once the writer thread has written it, and
    None while it is not (not yet, or not at all: the completion then inserts the row whole). Only the
    writer thread reads or sets it, and it takes the arrival before the completion that follows it."""

    call: CallStart
    row_id: int | None = None


class CaptureWriter:
    def __init__(self, path: str | Path, synchronous: str = "FULL", max_batch: int = 256, busy_timeout: float = 30.0):
        self.path = str(path)
        self.synchronous = synchronous.upper()
        self._max_batch = max_batch
        self._last_error = ""  # why the last transaction could not commit
        Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        self.busy_timeout = self._busy_applied = busy_timeout
        self._conn = schema.connect(self.path, self.synchronous, busy_timeout)
        self._sync_applied = self.synchronous
        schema.ensure(self._conn)
        schema.presize_wal(self._conn, self.path, self.synchronous)
        self._files = _identity(self.path)
        self.key_salt = schema.secret(self._conn, "key_salt")
        self.seal_key = schema.secret(self._conn, "seal_key")
        self.token, self._lease = _take_lease(self.path)
        self.interrupted = self._reap_dead_writers()
        self._bodies = BodyBases()  # request bodies this writer committed, to encode the next ones against
        self._answers = BodyBases(kind="large answers")  # and large response bodies, against the session's earlier answers
        self._bases = (self._bodies, self._answers)  # both follow the transaction: undo, abort, commit alike
        self._packer = Packer(self._conn)  # small values compressed with dictionaries trained on them
        self._id_floor = first_row_id(self.path) or None  # a shard's ids start in its own range (shards.py)
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = threading.Thread(
            target=self._loop, name="polar-capture-writer", daemon=True
        )
        self._thread.start()

    # -- the API (event loop side) ---------------------------------------------------------

    def start(self, call: CallStart) -> Arrival:
        """Queue an arriving call's pending row, committed by the writer thread while the call goes on
        (nothing waits for it; a failure is logged, and `finish` then inserts the row whole)."""
        arrival = Arrival(call)
        self._queue.put((("start", arrival), None))
        return arrival

    def finish(self, arrival: Arrival, end: CallEnd) -> asyncio.Future[int]:
        """Queue a call's completion (its row updated, or inserted whole): a future of the row id, set once
        the row has committed. Queued at once, so the caller may do other work before awaiting it."""
        fut = asyncio.get_running_loop().create_future()
        self._queue.put((("finish", arrival, end), fut))
        return fut

    async def flush(self) -> None:
        """Wait until everything queued before this has been committed (or has failed)."""
        fut = asyncio.get_running_loop().create_future()
        self._queue.put((("flush",), fut))
        await fut

    def size_bases(self, max_bytes: int) -> None:
        """The bases' memory (each of request bodies and of large answers), applied from the next commit."""
        for bases in self._bases:
            bases.max_bytes = max_bytes  # one int, read by the writer thread at its next commit

    def tune(self, synchronous: str, busy_timeout: float) -> None:
        """New commit mode and lock wait for this database, applied from its next transaction (an option
        change on the same file: never a second writer)."""
        self.synchronous, self.busy_timeout = synchronous.upper(), busy_timeout

    def close(self) -> None:
        thread, self._thread = self._thread, None  # a second close is a no-op
        if thread is not None and thread.is_alive():
            self._submit(_STOP).result(timeout=60)
            thread.join(timeout=60)
            self._conn.close()
            _drop_lease(self.path, self.token, self._lease)

    def _submit(self, op: Any) -> Future:
        fut: Future = Future()
        self._queue.put((op, fut))
        return fut

    @staticmethod
    def _answer(replies: list[tuple[Any, Any]]) -> None:
        """Hand each waiter its outcome: a thread's future at once, an event loop's futures in one wake-up
        of that loop (a loop already closed has no one left waiting)."""
        by_loop: dict[Any, list[tuple[asyncio.Future, Any]]] = defaultdict(list)
        for fut, outcome in replies:
            if isinstance(fut, Future):
                _resolve(fut, outcome)
            else:
                by_loop[fut.get_loop()].append((fut, outcome))
        for loop, items in by_loop.items():
            try:
                loop.call_soon_threadsafe(_settle_futures, items)
            except RuntimeError:  # that loop is closed
                pass

    # -- the writer thread -----------------------------------------------------------------

    def _loop(self) -> None:
        # Plain parameterised statements on the hot path: sqlite-utils' insert/update introspect
        # the table on every call; the schema is its job (schema.ensure).
        while True:
            batch = [self._queue.get()]
            while len(batch) < self._max_batch:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            work, control = [], []  # control: a flush or the stop, answered once the writes before are done
            for item in batch:
                (control if item[0] is _STOP or item[0][0] == "flush" else work).append(item)
            replies: list[tuple[Any, Any]] = []
            try:
                if work:
                    replies = self._commit_group(work)
            except Exception as exc:  # never leave a caller waiting, never let the writer die
                log.exception("capture writer failed on a group of %d writes", len(work))
                if self._conn.in_transaction:
                    self._conn.execute("ROLLBACK")
                self._abort(work, str(exc))
                replies = [(fut, CaptureError(f"{type(exc).__name__}: {exc}")) for _, fut in work]
            replies = [(fut, out) for fut, out in replies if fut is not None]
            replies += [(fut, None) for _, fut in control]
            self._answer(replies)
            if any(op is _STOP for op, _ in control):
                return

    def _commit_group(self, work: list[tuple[Any, Any]]) -> list[tuple[Any, Any]]:
        """Commit a group of writes: each write's waiter (None for an arrival) and its outcome."""
        # Only completions are awaited by a client's answer, so only they pay for an fsync; a group of
        # arrivals alone commits without one (still safe against the proxy being killed).
        durable = any(op[0] == "finish" for op, _ in work)
        if _identity(self.path) != self._files:
            outcomes: Any = CaptureError(f"the capture database {self.path} was deleted, moved or replaced while "
                                         "polar had it open; writes would be lost (restart polar)")
        else:
            outcomes = self._transaction(work, durable)
        if isinstance(outcomes, CaptureError):  # no transaction at all (locked, file gone): all fail alike
            outcomes = [outcomes] * len(work)
        elif outcomes is None:  # the COMMIT itself failed: give every write its own chance
            outcomes = []
            for item in work:
                one = self._transaction([item], durable=item[0][0] == "finish")
                outcomes.append(one if isinstance(one, CaptureError) else one[0] if one else CaptureError(self._last_error))
        replies = []
        for (op, fut), outcome in zip(work, outcomes):
            if isinstance(outcome, BaseException):
                if op[0] == "start":  # not written (its row id already cleared): its completion inserts it whole
                    log.error("could not record the arrival of call %s: %s", op[1].call.call_id, outcome)
                else:
                    log.error("capture write failed (%s): %s", op[0], outcome)
                outcome = outcome if isinstance(outcome, CaptureError) else CaptureError(str(outcome))
            replies.append((fut, outcome))
        return replies

    def _transaction(self, work: list[tuple[Any, Any]], durable: bool) -> list[Any] | CaptureError | None:
        """Run `work` in one transaction, each write in its own savepoint. None if the COMMIT failed,
        a CaptureError if the transaction could not begin."""
        conn = self._conn
        try:
            if self.busy_timeout != self._busy_applied:
                conn.execute(f"PRAGMA busy_timeout={int(self.busy_timeout * 1000)}")
                self._busy_applied = self.busy_timeout
            sync = self.synchronous if durable else "NORMAL"
            if sync != self._sync_applied:  # a PRAGMA is a statement like any other: only when it changes
                conn.execute(f"PRAGMA synchronous={sync}")
                self._sync_applied = sync
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            return CaptureError(f"could not open a write transaction: {exc}")
        outcomes: list[Any] = []
        for op, _ in work:
            conn.execute("SAVEPOINT w")
            marks = [bases.mark() for bases in self._bases]
            try:
                outcomes.append(self._apply(op))
                conn.execute("RELEASE w")
            except Exception as exc:  # noqa: BLE001 — any failed write (SQLite, encoding, a bug) is undone alone
                if op[0] == "start":
                    op[1].row_id = None
                for bases, mark in zip(self._bases, marks):
                    bases.undo(mark)  # its bodies are no base for anyone
                if not conn.in_transaction:  # SQLite rolled the whole transaction back (disk full, I/O error)
                    self._abort(work, str(exc))
                    return None
                conn.execute("ROLLBACK TO w")  # this write alone is undone; the others stand
                conn.execute("RELEASE w")
                outcomes.append(self._fallback(op, exc))
        try:
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            self._abort(work, str(exc))
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            return None
        for bases in self._bases:
            bases.commit()  # only now may later rows use this transaction's bodies as bases
        if self._packer.waiting:  # a dictionary trained in this transaction: stored in one of its own
            self._packer.store(conn)
        return outcomes

    def _abort(self, work: list[tuple[Any, Any]], error: str) -> None:
        """The transaction is gone: nothing in it was written (its arrivals have no row, its bodies are no base)."""
        for bases in self._bases:
            bases.abort()
        for op, _ in work:
            if op[0] == "start":
                op[1].row_id = None
        self._last_error = error

    def _apply(self, op: tuple) -> int:
        if op[0] == "start":
            # Set now, not at the commit: the call's completion may follow in this same transaction.
            op[1].row_id = self._insert_call(op[1].call, {})
            return op[1].row_id
        _, arrival, end = op
        row_id, call = arrival.row_id, arrival.call
        fields, values = end.encode(self._packer, self._store_answer(call.session_id, end.response_body))
        for value in values:  # the tools come with every call: compressed only the first time
            if self._conn.execute("SELECT 1 FROM messages WHERE hash=?", (value.digest,)).fetchone() is None:
                self._conn.execute("INSERT INTO messages (hash, body) VALUES (?, ?)", (value.digest,
                                                                                        value.stored(self._packer)))
        if row_id is not None:
            cur = self._conn.execute(
                f"UPDATE calls SET {', '.join(f'{k}=?' for k in fields)} WHERE id=?", [*fields.values(), row_id]
            )
            if cur.rowcount == 1:
                return row_id
        return self._insert_call(call, fields)  # its arrival row is not there

    def _store_answer(self, session: str, body: bytes) -> dict[str, Any] | None:
        """A large response body in `bodies`, encoded against the session's earlier answers: its columns.
        None for a smaller one (its row holds it, packed with the responses' dictionary)."""
        if len(body) <= ANSWER_APART:
            return None
        encoded = self._answers.encode(session, body)
        body_id = store(self._conn, encoded)
        self._answers.wrote(session, body_id, body, encoded)
        return {"response_body": None, "response_encoding": encoded.encoding, "response_body_id": body_id}

    def _insert_call(self, call: CallStart, fields: dict[str, Any]) -> int:
        body = call.stored_body()
        encoded = self._bodies.encode(call.session_id, body)
        columns = write_body(self._conn, encoded)
        if columns["body_id"] is not None:
            self._bodies.wrote(call.session_id, columns["body_id"], body, encoded)
        return self._insert({**call.row(self._packer), **columns, **fields, "writer": self.token})

    def _insert(self, row: dict[str, Any]) -> int:
        unknown = set(row) - set(schema.CALLS)
        if unknown:  # column names come from code, never from clients: a typo is a bug
            raise KeyError(f"unknown capture columns {sorted(unknown)}")
        if self._id_floor is not None:  # until a row in the shard's range is stored, the first one gets its id
            (top,) = self._conn.execute("SELECT max(id) FROM calls").fetchone()
            if (top or 0) < self._id_floor:
                row = {"id": self._id_floor + 1, **row}
            else:
                self._id_floor = None
        cur = self._conn.execute(f"INSERT INTO calls ({', '.join(row)}) VALUES ({', '.join('?' * len(row))})",
                                 list(row.values()))
        return int(cur.lastrowid)

    def _fallback(self, op: tuple, exc: Exception) -> Exception:
        """A completion that cannot be stored as it is (say, text SQLite cannot encode) still leaves its
        row saying so; the waiting call gets the error either way."""
        if op[0] == "finish" and op[1].row_id is not None:
            try:
                self._conn.execute(
                    "UPDATE calls SET status='error', error_kind='capture_failed', error=? WHERE id=?",
                    (f"polar could not record this call: {type(exc).__name__}: {exc}", op[1].row_id),
                )
            except sqlite3.Error:
                pass
        return CaptureError(f"{type(exc).__name__}: {exc}")

    # -- leases ---------------------------------------------------------------------------

    def _reap_dead_writers(self) -> int:
        """Mark interrupted the pending rows of writers that no longer hold their lease."""
        pending = [w for (w,) in self._conn.execute("SELECT DISTINCT writer FROM calls WHERE status='pending'")]
        dead = [w for w in pending if w != self.token and not _lease_held(self.path, w)]
        count = 0
        for writer in dead:
            cur = self._conn.execute(
                "UPDATE calls SET status='interrupted', error_kind='interrupted', "
                "error='the proxy stopped before this call finished' WHERE status='pending' AND writer IS ?",
                (writer,),
            )
            count += cur.rowcount
            if writer:
                Path(_lease_dir(self.path), writer).unlink(missing_ok=True)
        if count:
            log.warning("marked %d calls from an earlier run as interrupted", count)
        return count


def _settle_futures(items: list[tuple[asyncio.Future, Any]]) -> None:
    """On the waiting loop: resolve its futures (one a caller gave up on is left alone)."""
    for fut, outcome in items:
        if not fut.done():
            _resolve(fut, outcome)


def _resolve(fut: Future | asyncio.Future, outcome: Any) -> None:
    """An exception outcome is raised to the waiter, anything else is its result."""
    if isinstance(outcome, BaseException):
        fut.set_exception(outcome)
    else:
        fut.set_result(outcome)


def _identity(path: str) -> tuple:
    """Which files the database and its WAL are (device, inode); None for one that is not there."""
    def one(name: str):
        try:
            st = os.stat(name)
        except FileNotFoundError:
            return None
        return st.st_dev, st.st_ino

    return one(path), one(path + "-wal")


def _lease_dir(path: str) -> str:
    return path + ".writers"


def _take_lease(path: str) -> tuple[str, int]:
    token = f"{os.getpid()}-{secrets.token_hex(6)}"
    os.makedirs(_lease_dir(path), exist_ok=True)
    fd = os.open(os.path.join(_lease_dir(path), token), os.O_CREAT | os.O_RDWR, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.write(fd, json.dumps({"pid": os.getpid()}).encode())
    return token, fd


def _lease_held(path: str, token: str | None) -> bool:
    if not token:
        return False  # rows from before leases existed: their writer is long gone
    try:
        fd = os.open(os.path.join(_lease_dir(path), token), os.O_RDWR)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing drops a lock we may just have taken
    return False


def _drop_lease(path: str, token: str, fd: int) -> None:
    Path(_lease_dir(path), token).unlink(missing_ok=True)
    os.close(fd)
