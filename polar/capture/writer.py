"""The capture writer: one SQLite row per model call, committed before the client sees the answer.

A call alone (no other in flight) is written on its own thread, at once: its arrival (a pending row, so a
crash leaves the call visible) and its completion, each in a short transaction of its own, the
completion made durable (FULL) by an fdatasync of the WAL before `finish` returns. Handing a lone call's
statements to another thread costs it more than they do: each hand-off is a wake-up, and the woken thread
then waits for the GIL while the event loop goes on. Calls that overlap are handed to the writer thread,
which commits what has queued in groups and makes each group durable with one fdatasync, so under load
many calls share one transaction and one fdatasync. The connection runs at `synchronous=NORMAL` (SQLite
syncs around its checkpoints, and the WAL header on reuse); the explicit fdatasync after a commit is the
WAL sync FULL would do inside it, moved where it costs least.

The caller's thread never waits for another process's write lock: it asks without a busy timeout, and
on SQLITE_BUSY hands the write over; the writer thread waits up to `busy_timeout`. While the writer thread
holds handed writes, later ones queue behind them, so a call's completion never overtakes its arrival.
In the writer thread's groups each write runs in its own SAVEPOINT, so a statement that fails rolls
back that write alone; if the group's COMMIT fails (disk full, I/O error), every write is retried in a
transaction of its own; if the transaction cannot even begin (the lock held past `busy_timeout`), the
group fails at once, not once per write. A completion that cannot be committed (or synced) raises
`CaptureError` to its caller, so a call whose capture failed never answers as if it had been recorded.
Completing a call whose arrival row is missing inserts the row whole.

SQLite in WAL mode keeps writing, without an error, to a database file deleted or replaced under it:
the writer checks that its path still names the file it opened and otherwise fails every write.

Several gateways may write one database (an option change, N processes per node): each writer holds a
lease and tags the rows it opens (capture/leases.py), so on start-up only the pending rows of writers that
died are marked interrupted, never a live gateway's.
"""

from __future__ import annotations

import asyncio
import logging
import os
import queue
import sqlite3
import threading
import weakref
from collections import defaultdict
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from polar.capture import leases, schema
from polar.capture.bodies import ANSWER_APART, BodyBases, store, write_body
from polar.capture.dictionaries import Packer
from polar.capture.jobs import Arrival, Arrive, Complete, Flush, Job, Stop, Sync
from polar.capture.records import CallEnd, CallStart, StoredMessage
from polar.capture.shards import first_row_id

log = logging.getLogger("polar.capture")

_SQLITE_BUSY = 5  # sqlite3.Error.sqlite_errorcode, primary code (extended codes keep it in the low byte)


class CaptureError(RuntimeError):
    """A capture write did not commit; the message says why (disk full, I/O error, …)."""


class _Locked(Exception):
    """The database's write lock is held elsewhere and this thread does not wait for it."""


class CaptureWriter:
    def __init__(self, path: str | Path, synchronous: str = "FULL", max_batch: int = 256, busy_timeout: float = 30.0):
        self.path = str(path)
        self.synchronous = synchronous.upper()  # FULL: completions wait for an fdatasync; NORMAL: for their commit
        self._max_batch = max_batch
        self._last_error = ""  # why the last transaction could not commit
        Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        self.busy_timeout = busy_timeout
        self._conn = schema.connect(self.path, "NORMAL", busy_timeout)
        schema.ensure(self._conn)
        schema.presize_wal(self._conn, self.path, "NORMAL")
        self._files = _identity(self.path)
        self._wal = os.open(self.path + "-wal", os.O_RDONLY)  # what an fdatasync makes durable
        self.key_salt = schema.secret(self._conn, "key_salt")
        self.seal_key = schema.secret(self._conn, "seal_key")
        self.token, self._lease = leases.take(self.path)
        self.interrupted = leases.reap_dead_writers(self._conn, self.path, self.token)
        self._conn.execute("PRAGMA busy_timeout=0")  # writes on the caller's thread never wait for a lock
        self._wait_ms = 0  # the connection's busy timeout now
        self._patient = False  # whether the connection waits `busy_timeout` for a lock (the writer thread's writes)
        self._bodies = BodyBases()  # request bodies this writer committed, to encode the next ones against
        self._answers = BodyBases(kind="large answers")  # and large response bodies, against the session's earlier answers
        self._bases = (self._bodies, self._answers)  # both follow the transaction: undo, abort, commit alike
        self._packer = Packer(self._conn)  # small values compressed with dictionaries trained on them
        self._id_floor = first_row_id(self.path) or None  # a shard's ids start in its own range (shards.py)
        # Pending rows whose completion could not be written (disk full, I/O error): marked failed by the next
        # transaction that commits, so no row stays `pending` while this writer's lease lives on.
        self._unsettled: dict[int, str] = {}
        self._owner = threading.Lock()  # held by whichever thread is using the connection
        self._handed = 0  # writes queued for the writer thread and not yet written: later ones queue behind them
        self._handed_lock = threading.Lock()
        self._in_flight: weakref.WeakSet[Arrival] = weakref.WeakSet()  # started, not finished (a lone one syncs itself)
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = threading.Thread(
            target=self._loop, name="polar-capture-writer", daemon=True
        )
        self._thread.start()

    # -- the API (the caller's side) -------------------------------------------------------

    def start(self, call: CallStart) -> Arrival:
        """Write an arriving call's pending row (a failure is logged, and `finish` then inserts the row whole)."""
        arrival = Arrival(call)
        alone = not self._in_flight
        self._in_flight.add(arrival)
        item = Job(Arrive(arrival), None)
        if not alone or self._now(item) is None:
            self._hand(item)
        return arrival

    def finish(self, arrival: Arrival, end: CallEnd) -> asyncio.Future[int]:
        """Write a call's completion (its row updated, or inserted whole): a future of the row id, set once the
        row is durable (FULL: an fdatasync has covered its commit; NORMAL: committed), or failing with
        CaptureError. The caller may do other work before awaiting it."""
        fut = asyncio.get_running_loop().create_future()
        self._in_flight.discard(arrival)
        item = Job(Complete(arrival, end), fut)
        outcome = None if self._in_flight else self._now(item)
        if outcome is None:
            self._hand(item)
        elif self.synchronous == "FULL" and not isinstance(outcome, BaseException):
            if not self._queue.empty():  # the writer thread is syncing others: one fdatasync for all
                self._queue.put(Job(Sync(outcome), fut))
                return fut
            _resolve(fut, self._fdatasync() or outcome)
        else:
            _resolve(fut, outcome)
        return fut

    async def flush(self) -> None:
        """Wait until everything written or queued before this is durable (or has failed)."""
        fut = asyncio.get_running_loop().create_future()
        self._queue.put(Job(Flush(), fut))
        await fut

    def size_bases(self, max_bytes: int) -> None:
        """The bases' memory (each of request bodies and of large answers), applied from the next commit."""
        for bases in self._bases:
            bases.max_bytes = max_bytes  # one int, read at the next commit

    def tune(self, synchronous: str, busy_timeout: float) -> None:
        """New commit mode and lock wait for this database, applied from its next write (an option change on the
        same file: never a second writer)."""
        self.synchronous, self.busy_timeout = synchronous.upper(), busy_timeout

    def close(self) -> None:
        thread, self._thread = self._thread, None  # a second close is a no-op
        if thread is not None and thread.is_alive():
            self._submit(Stop()).result(timeout=60)
            thread.join(timeout=60)
            self._conn.close()
            os.close(self._wal)
            leases.drop(self.path, self.token, self._lease)

    def _now(self, item: Job) -> Any:
        """Write `item` on this thread when nothing is handed to the writer thread and no one else holds the
        connection: its outcome (a row id, or the exception). None: it must go to the writer thread."""
        if self._handed or not self._owner.acquire(blocking=False):
            return None
        try:
            if self._handed:  # handed over meanwhile: it goes behind what was
                return None
            self._patience(False)
            ((_, outcome),) = self._guarded([item])
            return outcome
        except _Locked:
            return None
        finally:
            self._owner.release()

    def _fdatasync(self) -> CaptureError | None:
        """Make every commit so far durable: None, or why it could not be (then none of them is)."""
        try:
            os.fdatasync(self._wal)
        except OSError as exc:
            log.error("capture writes could not be made durable: fdatasync of the WAL failed: %s", exc)
            return CaptureError(f"the capture could not be made durable (fdatasync: {exc})")
        return None

    def _hand(self, item: Job) -> None:
        with self._handed_lock:
            self._handed += 1
        self._queue.put(item)

    def _submit(self, op: Stop) -> Future:
        fut: Future = Future()
        self._queue.put(Job(op, fut))
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
            # writes handed over; completions written elsewhere, waiting for durability; a flush or the stop,
            # answered once everything before them is done
            work, syncs, control = [], [], []
            for item in batch:
                op = item.op
                (syncs if isinstance(op, Sync) else control if isinstance(op, (Flush, Stop)) else work).append(item)
            replies = self._write_handed(work) if work else []  # (the waiter, the outcome) of each
            failed = [(fut, out) for fut, out in replies if fut is not None and isinstance(out, BaseException)]
            durable = [(fut, out) for fut, out in replies if fut is not None and not isinstance(out, BaseException)]
            durable += [(fut, op.row_id) for op, fut in syncs]
            if durable and self.synchronous == "FULL" and (lost := self._fdatasync()):
                durable = [(fut, lost) for fut, _ in durable]
            replies = failed + durable + [(fut, None) for _, fut in control]
            self._answer(replies)
            if any(isinstance(op, Stop) for op, _ in control):
                return

    def _write_handed(self, work: list[Job]) -> list[tuple[Any, Any]]:
        """Write what was handed over, in one group, waiting for another process's lock up to `busy_timeout`."""
        with self._owner:
            try:
                self._patience(True)
                return self._guarded(work)
            finally:
                with self._handed_lock:
                    self._handed -= len(work)

    def _guarded(self, work: list[Job]) -> list[tuple[Any, Any]]:
        """`_commit_group`, where a failure of polar's own fails these writes, not the caller or the writer."""
        try:
            return self._commit_group(work)
        except _Locked:
            raise
        except Exception as exc:
            log.exception("capture writer failed on a group of %d writes", len(work))
            if self._conn.in_transaction:
                self._conn.execute("ROLLBACK")
            self._abort(work, str(exc))
            return [(fut, CaptureError(f"{type(exc).__name__}: {exc}")) for _, fut in work]

    def _patience(self, patient: bool) -> None:
        """The writer thread waits `busy_timeout` for another process's lock; the caller's thread never does."""
        wait_ms = int(self.busy_timeout * 1000) if patient else 0  # (busy_timeout may have been tuned since)
        if wait_ms != self._wait_ms:  # a PRAGMA is a statement like any other: only when it changes
            self._conn.execute(f"PRAGMA busy_timeout={wait_ms}")
            self._wait_ms = wait_ms
        self._patient = patient

    def _commit_group(self, work: list[Job]) -> list[tuple[Any, Any]]:
        """Commit a group of writes: each write's waiter (None for an arrival) and its outcome. Raises _Locked
        when the lock is held elsewhere and this thread does not wait for it."""
        if _identity(self.path) != self._files:
            outcomes: Any = CaptureError(f"the capture database {self.path} was deleted, moved or replaced while "
                                         "polar had it open; writes would be lost (restart polar)")
        else:
            outcomes = self._transaction(work)
        if isinstance(outcomes, CaptureError):  # no transaction at all (locked, file gone): all fail alike
            outcomes = [outcomes] * len(work)
        elif outcomes is None:  # the COMMIT itself failed: give every write its own chance
            outcomes = []
            for item in work:
                one = self._transaction([item])
                outcomes.append(one if isinstance(one, CaptureError) else one[0] if one else CaptureError(self._last_error))
        replies = []
        for (op, fut), outcome in zip(work, outcomes):
            if isinstance(outcome, BaseException):
                if isinstance(op, Arrive):  # not written (its row id already cleared): its completion inserts it whole
                    log.error("could not record the arrival of call %s: %s", op.arrival.call.call_id, outcome)
                else:
                    log.error("capture write failed (completion): %s", outcome)
                    if op.arrival.row_id is not None:  # its pending row stands: settled by a later commit
                        self._unsettled[op.arrival.row_id] = f"polar could not record this call: {outcome}"
                outcome = outcome if isinstance(outcome, CaptureError) else CaptureError(str(outcome))
            replies.append((fut, outcome))
        return replies

    def _transaction(self, work: list[Job]) -> list[Any] | CaptureError | None:
        """Run `work` in one transaction, each write in its own savepoint. None if the COMMIT failed,
        a CaptureError if the transaction could not begin (_Locked when this thread does not wait)."""
        conn = self._conn
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            if not self._patient and getattr(exc, "sqlite_errorcode", 0) & 0xFF == _SQLITE_BUSY:
                raise _Locked() from None
            return CaptureError(f"could not open a write transaction: {exc}")
        settling = self._settle_failed()
        outcomes: list[Any] = []
        for op, _ in work:
            conn.execute("SAVEPOINT w")
            marks = [bases.mark() for bases in self._bases]
            try:
                outcomes.append(self._apply(op))
                conn.execute("RELEASE w")
            except Exception as exc:  # noqa: BLE001 — any failed write (SQLite, encoding, a bug) is undone alone
                if isinstance(op, Arrive):
                    op.arrival.row_id = None
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
        for row_id in settling:
            self._unsettled.pop(row_id, None)
        for bases in self._bases:
            bases.commit()  # only now may later rows use this transaction's bodies as bases
        if self._packer.waiting:  # a dictionary trained in this transaction: stored in one of its own
            self._packer.store(conn)
        return outcomes

    def _settle_failed(self) -> list[int]:
        """Mark the pending rows of completions that failed earlier as failed, in this transaction (a savepoint of
        their own: if it fails, they wait for the next one). The rows it covers, once it commits."""
        if not self._unsettled:
            return []
        rows = list(self._unsettled.items())
        self._conn.execute("SAVEPOINT settle")
        try:
            self._conn.executemany(
                "UPDATE calls SET status='error', error_kind='capture_failed', error=? WHERE id=? AND status='pending'",
                [(error, row_id) for row_id, error in rows])
        except sqlite3.Error:
            if self._conn.in_transaction:
                self._conn.execute("ROLLBACK TO settle")
                self._conn.execute("RELEASE settle")
            return []
        self._conn.execute("RELEASE settle")
        return [row_id for row_id, _ in rows]

    def _abort(self, work: list[Job], error: str) -> None:
        """The transaction is gone: nothing in it was written (its arrivals have no row, its bodies are no base)."""
        for bases in self._bases:
            bases.abort()
        for op, _ in work:
            if isinstance(op, Arrive):
                op.arrival.row_id = None
        self._last_error = error

    def _apply(self, op: Arrive | Complete) -> int:
        if isinstance(op, Arrive):
            # Set now, not at the commit: the call's completion may follow in this same transaction.
            op.arrival.row_id = self._insert_call(op.arrival.call, {})
            return op.arrival.row_id
        arrival, end = op.arrival, op.end
        row_id, call = arrival.row_id, arrival.call
        fields, values = end.encode(self._packer, self._store_answer(call.session_id, end.response_body))
        self._store_values(values)
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

    def _store_values(self, values: list[StoredMessage]) -> None:
        """Content-addressed values a row references (the tools come with every call: compressed only the first time)."""
        for value in values:
            if self._conn.execute("SELECT 1 FROM messages WHERE hash=?", (value.digest,)).fetchone() is None:
                self._conn.execute("INSERT INTO messages (hash, body) VALUES (?, ?)", (value.digest,
                                                                                        value.stored(self._packer)))

    def _insert_call(self, call: CallStart, fields: dict[str, Any]) -> int:
        body = call.stored_body()
        encoded = self._bodies.encode(call.session_id, body)
        columns = write_body(self._conn, encoded)
        if columns["body_id"] is not None:
            self._bodies.wrote(call.session_id, columns["body_id"], body, encoded)
        row, values = call.encode(self._packer)
        self._store_values(values)
        return self._insert({**row, **columns, **fields, "writer": self.token})

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

    def _fallback(self, op: Arrive | Complete, exc: Exception) -> Exception:
        """A completion that cannot be stored as it is (say, text SQLite cannot encode) still leaves its
        row saying so; the waiting call gets the error either way."""
        if isinstance(op, Complete) and op.arrival.row_id is not None:
            try:
                self._conn.execute(
                    "UPDATE calls SET status='error', error_kind='capture_failed', error=? WHERE id=?",
                    (f"polar could not record this call: {type(exc).__name__}: {exc}", op.arrival.row_id),
                )
            except sqlite3.Error:
                pass
        return CaptureError(f"{type(exc).__name__}: {exc}")


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
