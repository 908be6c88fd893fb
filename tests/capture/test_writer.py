"""The capture writer and reader: linear token storage, durability, faults, leases, read-only reading."""

from __future__ import annotations

import asyncio
import json
import os
import random
import sqlite3
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from polar.capture.reader import CaptureReader
from polar.capture.records import CallEnd, CallStart
from polar.capture.tokens import common_prefix_len, pack_ids, unpack_ids
from polar.capture.writer import Arrival, CaptureError, CaptureWriter
from polar.sqlite_files import WrongDatabase
from tests.support.captures import Recorder, finish_now


def _start(call_id: str, session: str = "s", **extra) -> CallStart:
    return CallStart(call_id=call_id, session_id=session, provider="test", endpoint="generate", path="/t", client=None,
                     key_hash=None, request_headers=extra.get("headers", {}), request_body=b"{}", t_start=time.time())


def _end(**fields) -> CallEnd:
    return CallEnd(**{"status": "ok", "http_status": 200, "response_body": b"{}", "t_end": time.time(), **fields})


def _rows(path) -> dict[str, dict]:
    return {r["call_id"]: r for r in CaptureReader(path).calls(with_tokens=False)}


def test_pack_roundtrip_and_prefix():
    ids = [0, 1, 248045, 2**32 - 1]
    assert unpack_ids(pack_ids(ids)) == ids
    a, b = np.array([1, 2, 3, 4], "<u4"), np.array([1, 2, 9], "<u4")
    assert common_prefix_len(a, b) == 2 and common_prefix_len(a, a[:0]) == 0


def test_growing_session_is_stored_linearly(tmp_path):
    rec = Recorder(tmp_path / "c.db")
    prompt, rows = list(range(60)), []  # 240 B: stored as they are, like each turn's 5 new ids
    for turn in range(20):
        completion = [1000 + turn * 10 + i for i in range(10)]
        rows.append(rec.call("s1", prompt, completion))
        prompt = prompt + completion + [5000 + turn] * 5  # next prompt extends prompt+completion
    stored = sqlite3.connect(tmp_path / "c.db").execute("SELECT sum(length(prompt_suffix)) / 4 FROM calls").fetchone()[0]
    assert stored == 60 + 19 * 5  # the first prompt and 5 new ids a turn, not 20 growing prompts
    by_id = {r["id"]: r for r in rec.reader.calls(session="s1")}
    expected = list(range(60))
    for turn, row_id in enumerate(rows):
        assert by_id[row_id]["prompt_ids"] == expected
        expected = expected + by_id[row_id]["completion_ids"] + [5000 + turn] * 5
    rec.close()


def test_interleaved_lineages_find_their_own_parent(tmp_path):
    rec = Recorder(tmp_path / "c.db")
    main, sub = rec.call("s", [1, 2, 3], [4]), rec.call("s", [9, 9, 9], [8])  # a sub-agent: unrelated prompt
    main2, sub2 = rec.call("s", [1, 2, 3, 4, 5], [6]), rec.call("s", [9, 9, 9, 8, 7], [6])
    rows = {r["id"]: r for r in rec.rows()}
    assert rows[main2]["prompt_parent"] == main and rows[sub2]["prompt_parent"] == sub
    assert rows[main2]["prompt_ids"] == [1, 2, 3, 4, 5] and rows[sub2]["prompt_ids"] == [9, 9, 9, 8, 7]
    rec.close()


def test_missing_logprobs_are_stored_as_missing(tmp_path):
    rec = Recorder(tmp_path / "c.db")
    rec.call("s", [1], [2, 3], no_logprobs=True)
    rec.call("s", [1, 2, 3, 4], [5], logprobs=[-0.5])
    first, second = rec.rows()
    assert first["completion_logprobs"] is None and second["completion_logprobs"] == [-0.5]
    rec.close()


def test_find_call_is_scoped_to_the_session(tmp_path):
    rec = Recorder(tmp_path / "c.db")
    row_id = rec.call("alice", [1], [2])
    assert rec.reader.find_call(f"c{row_id:04d}", "alice")["id"] == row_id
    assert rec.reader.find_call(f"c{row_id:04d}", "mallory") is None
    rec.close()


def test_reader_is_read_only_and_refuses_what_is_not_a_capture_db(tmp_path):
    with pytest.raises(WrongDatabase, match="no capture database"):
        CaptureReader(tmp_path / "missing.db")
    assert not (tmp_path / "missing.db").exists()
    rec = Recorder(tmp_path / "c.db")
    rec.call("s", [1], [2])
    with pytest.raises(sqlite3.OperationalError, match="readonly"):
        rec.reader.connect().execute("DELETE FROM calls")
    rec.close()


def test_wal_is_presized_so_commits_overwrite_instead_of_growing_it(tmp_path):
    """Appending commits pay a metadata flush in their fsync; a presized WAL is overwritten in place."""
    rec = Recorder(tmp_path / "c.db")
    wal = tmp_path / "c.db-wal"
    conn = sqlite3.connect(tmp_path / "c.db")
    page, pages = (conn.execute(f"PRAGMA {p}").fetchone()[0] for p in ("page_size", "wal_autocheckpoint"))
    size = wal.stat().st_size
    assert size >= page * pages
    for i in range(200):
        rec.call("s1", list(range(50 + i)), [7, 8, 9])
    assert wal.stat().st_size == size
    assert "_polar_wal_presize" not in {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
    conn.close()
    rec.close()
    CaptureWriter(tmp_path / "c.db").close()  # reopening keeps its rows
    assert sqlite3.connect(tmp_path / "c.db").execute("SELECT count(*) FROM calls").fetchone()[0] == 200


def test_canonical_messages_are_stored_once_and_read_back_exactly(tmp_path):
    """A turn re-sends the whole history: each message is stored once, an edited one again, and every
    row reads back its own conversation (also when sessions interleave)."""
    rec = Recorder(tmp_path / "c.db")

    def msg(role: str, text: str) -> dict:
        return {"role": role, "content": [{"type": "text", "text": text}]}

    history, sent = [msg("system", "be brief"), msg("user", "hi")], {}
    for turn in range(4):
        history = history + [msg("assistant", f"answer {turn}"), msg("user", f"more {turn}")]
        sent[rec.fail("a", history, status="ok")] = history
        other = [msg("user", f"b {turn}")]  # another session in between
        sent[rec.fail("b", other, status="ok")] = other
    edited = [msg("system", "be brief"), msg("user", "hi, edited"), *history[2:]]
    sent[rec.fail("a", edited, status="ok")] = edited
    rows = {r["id"]: r for r in rec.rows()}
    assert {i: rows[i]["canonical"]["messages"] for i in sent} == sent
    distinct = {json.dumps(m, sort_keys=True) for messages in sent.values() for m in messages}
    assert sqlite3.connect(tmp_path / "c.db").execute("SELECT count(*) FROM messages").fetchone()[0] == len(distinct)
    rec.close()


class _Lock:
    """Another process's write transaction on the database: while it holds the lock, writes are handed to the
    writer thread, which waits for it (up to busy_timeout) and then writes them as one group."""

    def __init__(self, db):
        self.conn = sqlite3.connect(db, isolation_level=None)
        self.conn.execute("BEGIN IMMEDIATE")

    def release(self) -> None:
        self.conn.execute("ROLLBACK")
        self.conn.close()


def test_writes_go_on_on_the_callers_thread_and_are_durable_only_after_an_fdatasync(tmp_path, monkeypatch):
    """The arrival is written at once (its row id known on return). A completion while another call is in
    flight waits for the writer thread's fdatasync of the WAL, which covers every commit made before it; a
    call alone syncs on its own thread before `finish` returns."""
    writer = CaptureWriter(tmp_path / "c.db")
    synced, release = [], threading.Event()
    real = os.fdatasync

    def held_sync(fd):
        if threading.current_thread() is not threading.main_thread():
            release.wait(5)
        synced.append((threading.current_thread() is threading.main_thread(), os.fstat(fd).st_ino))
        real(fd)

    monkeypatch.setattr("polar.capture.writer.os.fdatasync", held_sync)

    async def run():
        arrival, other = writer.start(_start("A")), writer.start(_start("B"))
        assert arrival.row_id is not None and _rows(tmp_path / "c.db")["A"]["status"] == "pending"
        fut = writer.finish(arrival, _end(model="m"))
        await asyncio.sleep(0.2)
        assert not fut.done() and _rows(tmp_path / "c.db")["A"]["status"] == "ok"  # committed, not yet durable
        release.set()
        row = await fut
        alone = writer.finish(other, _end(model="m"))  # the last call in flight
        assert alone.done()
        return arrival.row_id, row, other.row_id, await alone

    a_row, a_answered, b_row, b_answered = asyncio.run(run())
    wal = os.stat(tmp_path / "c.db-wal").st_ino
    assert a_answered == a_row and b_answered == b_row and synced == [(False, wal), (True, wal)]
    writer.close()


def test_a_failed_fdatasync_fails_the_calls_it_covered(tmp_path, monkeypatch):
    writer = CaptureWriter(tmp_path / "c.db")

    def broken(fd):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr("polar.capture.writer.os.fdatasync", broken)
    with pytest.raises(CaptureError, match="could not be made durable.*Input/output error"):
        finish_now(writer, writer.start(_start("A")), _end())
    monkeypatch.undo()
    finish_now(writer, writer.start(_start("B")), _end())
    writer.close()


def test_normal_mode_answers_at_the_commit_without_an_fdatasync(tmp_path, monkeypatch):
    writer = CaptureWriter(tmp_path / "c.db", synchronous="NORMAL")
    calls = []
    monkeypatch.setattr("polar.capture.writer.os.fdatasync", calls.append)

    async def run():
        fut = writer.finish(writer.start(_start("A")), _end())
        assert fut.done()
        return await fut

    assert asyncio.run(run()) == _rows(tmp_path / "c.db")["A"]["id"] and calls == []
    writer.close()


def test_another_processs_lock_never_blocks_the_caller(tmp_path):
    """While another process holds the write lock, a call's writes are handed to the writer thread: the
    caller goes on at once, and the writes land, in order, once the lock is released."""
    db = tmp_path / "c.db"
    writer = CaptureWriter(db, busy_timeout=10)
    lock = _Lock(db)

    async def run():
        t0 = time.monotonic()
        arrival = writer.start(_start("A"))
        fut = writer.finish(arrival, _end(model="m"))
        later = writer.start(_start("B"))  # behind the handed writes, though the lock may be free by then
        took = time.monotonic() - t0
        await asyncio.sleep(0.3)
        assert not fut.done()
        lock.release()
        return took, await fut, arrival, later

    took, row, arrival, later = asyncio.run(run())
    asyncio.run(writer.flush())
    rows = _rows(db)
    assert took < 0.1 and row == arrival.row_id == rows["A"]["id"] and rows["A"]["status"] == "ok"
    assert later.row_id == rows["B"]["id"] and len(rows) == 2
    finish_now(writer, writer.start(_start("C")), _end())  # and writes are back on the caller's thread
    writer.close()


def test_a_failed_write_never_loses_another_calls_row(tmp_path, caplog):
    """Arrivals A, B (failing) and C handed over together (another process held the lock) commit as one
    group: A's and C's rows stand, B's failure is logged, and B's completion, which cannot be stored
    either, fails its caller alone."""
    db = tmp_path / "c.db"
    writer = CaptureWriter(db)
    lock = _Lock(db)

    async def run():
        a = writer.start(_start("A"))
        b = writer.start(_start("B", headers={"x": object()}))  # cannot be encoded as JSON
        c = writer.start(_start("C"))
        lock.release()
        assert await writer.finish(a, _end(model="m")) == a.row_id
        with pytest.raises(CaptureError, match="not JSON serializable"):
            await writer.finish(b, _end(model="m"))
        return b, c

    b, c = asyncio.run(run())
    rows = _rows(db)
    assert set(rows) == {"A", "C"} and rows["A"]["status"] == "ok"
    assert b.row_id is None and rows["C"]["status"] == "pending" and rows["C"]["id"] == c.row_id
    assert "could not record the arrival of call B" in caplog.text
    writer.close()


def test_one_group_answers_every_waiting_loop_and_skips_a_caller_that_gave_up(tmp_path):
    """Completions from two event loops (two threads) and one abandoned caller, handed over together, share a
    group: each loop's callers get their own rows in one wake-up of that loop; the abandoned call is still
    committed."""
    db = tmp_path / "c.db"
    writer = CaptureWriter(db)
    lock = _Lock(db)
    queued = threading.Barrier(4)

    async def loop_calls(prefix: str, n: int) -> list[int]:
        arrivals = [writer.start(_start(f"{prefix}{i}")) for i in range(n)]
        done = asyncio.gather(*(writer.finish(a, _end()) for a in arrivals))
        await asyncio.to_thread(queued.wait, 5)
        return await done

    async def abandoned() -> None:
        task = asyncio.ensure_future(writer.finish(writer.start(_start("gone")), _end()))
        await asyncio.sleep(0.05)
        task.cancel()  # a client that disconnected while its row was being written
        await asyncio.to_thread(queued.wait, 5)

    with ThreadPoolExecutor(3) as pool:
        first = pool.submit(asyncio.run, loop_calls("a", 4))
        second = pool.submit(asyncio.run, loop_calls("b", 3))
        pool.submit(asyncio.run, abandoned())
        queued.wait(5)
        lock.release()
        ids = first.result(10) + second.result(10)
    asyncio.run(writer.flush())
    rows = _rows(db)
    assert sorted(ids) == sorted(rows[k]["id"] for k in rows if k != "gone") and len(set(ids)) == 7
    assert all(r["status"] == "ok" for r in rows.values()) and "gone" in rows
    writer.close()


def test_completing_a_call_whose_arrival_is_missing_inserts_it_whole(tmp_path):
    writer = CaptureWriter(tmp_path / "c.db")
    row = finish_now(writer, Arrival(_start("lost")), _end(model="m"))
    row2 = finish_now(writer, Arrival(_start("gone"), 987654), _end(model="m"))  # an id that is not there
    rows = _rows(tmp_path / "c.db")
    assert rows["lost"]["id"] == row and rows["gone"]["id"] == row2
    assert rows["lost"]["status"] == rows["gone"]["status"] == "ok" and rows["gone"]["path"] == "/t"
    writer.close()


def test_a_row_that_cannot_be_encoded_is_marked_and_its_caller_told(tmp_path):
    writer = CaptureWriter(tmp_path / "c.db")

    async def run():
        arrival = writer.start(_start("odd"))
        with pytest.raises(CaptureError, match="surrogates not allowed"):
            await writer.finish(arrival, _end(model="\ud800"))

    asyncio.run(run())
    row = _rows(tmp_path / "c.db")["odd"]
    assert row["status"] == "error" and row["error_kind"] == "capture_failed" and "surrogates" in row["error"]
    writer.close()


def test_disk_full_fails_the_waiting_call_and_the_writer_recovers(tmp_path):
    writer = CaptureWriter(tmp_path / "c.db")
    rec_row = finish_now(writer, Arrival(_start("before")), _end())
    pages = writer._conn.execute("PRAGMA page_count").fetchone()[0]
    writer._conn.execute(f"PRAGMA max_page_count={pages}")  # the database may not grow: "disk full"
    # More than the free pages the WAL presize left, even compressed: random bytes do not compress.
    big = _end(response_body=random.Random(0).randbytes(8_000_000))
    with pytest.raises(CaptureError, match="full"):
        finish_now(writer, Arrival(_start("big")), big)
    writer._conn.execute("PRAGMA max_page_count=1073741823")
    finish_now(writer, Arrival(_start("after")), big)
    rows = _rows(tmp_path / "c.db")
    assert set(rows) == {"before", "after"} and rows["before"]["id"] == rec_row
    writer.close()


def test_only_dead_writers_pending_rows_are_marked_interrupted(tmp_path):
    db = tmp_path / "c.db"
    live = CaptureWriter(db)
    live_call = live.start(_start("live"))
    asyncio.run(live.flush())
    # A gateway killed mid-call: its process exits without closing; the kernel drops its lease lock.
    script = ("import asyncio, os, time, sys; from polar.capture.writer import CaptureWriter; "
              "from tests.capture.test_writer import _start; w = CaptureWriter(sys.argv[1]); "
              "w.start(_start('dead')); asyncio.run(w.flush()); os._exit(0)")
    subprocess.run([sys.executable, "-c", script, str(db)], check=True, cwd=str(__import__("pathlib").Path(__file__).parents[2]))
    second = CaptureWriter(db)  # an option change, or a restart beside a live gateway
    rows = _rows(db)
    assert second.interrupted == 1 and rows["dead"]["status"] == "interrupted"
    assert rows["live"]["status"] == "pending"  # the live gateway's call is not touched
    finish_now(live, live_call, _end())
    assert _rows(db)["live"]["status"] == "ok"
    ids = [finish_now(w, Arrival(_start(f"n{i}")), _end()) for i, w in enumerate((live, second, live, second))]
    assert len(set(ids)) == 4  # ids come from SQLite: two writers never collide
    live.close(), second.close()
    assert CaptureWriter(db).interrupted == 0


def test_secrets_are_random_per_database_and_kept(tmp_path):
    a, b = CaptureWriter(tmp_path / "a.db"), CaptureWriter(tmp_path / "b.db")
    assert a.seal_key != b.seal_key and a.key_salt != b.key_salt and len(a.seal_key) == 32
    keys = (a.seal_key, a.key_salt)
    a.close(), b.close()
    again = CaptureWriter(tmp_path / "a.db")
    assert (again.seal_key, again.key_salt) == keys
    again.close()


def test_a_database_deleted_or_replaced_under_the_writer_fails_closed(tmp_path):
    """SQLite in WAL mode would go on writing to the unlinked file without an error: rows lost silently."""
    db = tmp_path / "c.db"
    writer = CaptureWriter(db)
    finish_now(writer, Arrival(_start("before")), _end())
    moved = tmp_path / "moved.db"
    db.rename(moved)
    with pytest.raises(CaptureError, match="deleted, moved or replaced"):
        finish_now(writer, Arrival(_start("lost")), _end())
    moved.rename(db)  # put back: the same file, so writes go on
    finish_now(writer, Arrival(_start("after")), _end())
    writer.close()
    assert set(_rows(db)) == {"before", "after"}


def test_a_lock_held_past_the_busy_timeout_fails_the_group_once_then_recovers(tmp_path):
    db = tmp_path / "c.db"
    writer = CaptureWriter(db, busy_timeout=0.3)
    other = sqlite3.connect(db, isolation_level=None)
    other.execute("BEGIN EXCLUSIVE")

    async def group():
        return await asyncio.gather(*(writer.finish(Arrival(_start(f"w{i}")), _end()) for i in range(5)),
                                    return_exceptions=True)

    t0 = time.monotonic()
    outcomes = asyncio.run(group())
    assert all(isinstance(o, CaptureError) and "locked" in str(o) for o in outcomes), outcomes
    assert time.monotonic() - t0 < 5 * 0.3  # not one busy timeout per write
    other.execute("ROLLBACK")
    finish_now(writer, Arrival(_start("after")), _end())
    writer.close()
    assert set(_rows(db)) == {"after"}


def test_a_long_prompt_suffix_is_stored_compressed_and_reads_back_exactly(tmp_path):
    """A turn's new ids past 256 B (tool output, a file) are zstd-compressed; ids read back exact, small
    suffixes stay as they are."""
    rng = random.Random(7)
    rec = Recorder(tmp_path / "c.db")
    prompt = [rng.randrange(151_000) for _ in range(3000)]  # any uint32 id, repetitive text or not
    first = rec.call("s1", prompt, [1, 2, 3])
    second_prompt = prompt + [1, 2, 3] + [42] * 10  # 10 new ids: stored as they are
    second = rec.call("s1", second_prompt, [4])
    conn = sqlite3.connect(tmp_path / "c.db")
    stored = dict(conn.execute("SELECT id, prompt_encoding FROM calls"))
    assert stored == {first: "zstd", second: None}
    by_id = {r["id"]: r for r in rec.reader.calls(session="s1")}
    assert by_id[first]["prompt_ids"] == prompt and by_id[second]["prompt_ids"] == second_prompt
    rec.close()


def test_a_database_from_before_prompt_encoding_reads_its_token_ids(tmp_path):
    rec = Recorder(tmp_path / "c.db")
    prompt = list(range(2000))
    rec.call("s1", prompt, [7, 8])
    rec.close()
    conn = sqlite3.connect(tmp_path / "c.db")  # as the earlier writer stored it: raw ids, no such column
    conn.execute("UPDATE calls SET prompt_suffix=?", (pack_ids(prompt),))
    conn.execute("ALTER TABLE calls DROP COLUMN prompt_encoding")
    conn.commit()
    conn.close()
    (row,) = CaptureReader(tmp_path / "c.db").calls(session="s1")
    assert row["prompt_ids"] == prompt and row["completion_ids"] == [7, 8]


def test_a_long_completion_is_stored_compressed_with_its_logprobs_and_reads_back_exactly(tmp_path):
    """Sampled ids and logprobs past 256 B share one encoding (zstd); both read back exact, and so does the
    next prompt that extends them. A short completion and a missing logprobs column stay as they are."""
    rng = random.Random(3)
    rec = Recorder(tmp_path / "c.db")
    sampled = [rng.randrange(151_000) for _ in range(2000)]
    logprobs = [-rng.random() * 3 for _ in range(2000)]
    long_row = rec.call("s1", [1, 2, 3], sampled, logprobs=logprobs)
    next_prompt = [1, 2, 3, *sampled, 9]
    short_row = rec.call("s1", next_prompt, [5, 6])
    bare_row = rec.call("s2", [1], sampled, no_logprobs=True)
    conn = sqlite3.connect(tmp_path / "c.db")
    stored = {r[0]: r[1:] for r in conn.execute("SELECT id, completion_encoding, length(completion_ids), "
                                                 "completion_logprobs IS NULL FROM calls")}
    assert stored[long_row][0] == "zstd" and stored[long_row][1] < 2000 * 4 * 0.8  # random ids: 17 bits of 32
    assert stored[short_row] == (None, 8, 0) and stored[bare_row][0] == "zstd" and stored[bare_row][2] == 1
    rows = {r["id"]: r for r in rec.reader.calls()}
    assert rows[long_row]["completion_ids"] == sampled
    assert rows[long_row]["completion_logprobs"] == np.asarray(logprobs, "<f4").tolist()
    assert rows[short_row]["prompt_ids"] == next_prompt and rows[short_row]["completion_ids"] == [5, 6]
    assert rows[bare_row]["completion_ids"] == sampled and rows[bare_row]["completion_logprobs"] is None
    rec.close()


def test_a_database_from_before_completion_encoding_reads_its_completions(tmp_path):
    """The previous writer's schema: prompt_encoding but no completion_encoding, completions as they are."""
    rec = Recorder(tmp_path / "c.db")
    prompt = list(range(2000))
    first = rec.call("s1", prompt, [7, 8])
    rec.call("s1", [*prompt, 7, 8, 9], [10])
    rec.close()
    conn = sqlite3.connect(tmp_path / "c.db")
    assert conn.execute("SELECT count(*) FROM calls WHERE completion_encoding IS NOT NULL").fetchone() == (0,)
    conn.execute("ALTER TABLE calls DROP COLUMN completion_encoding")
    conn.commit()
    conn.close()
    rows = {r["id"]: r for r in CaptureReader(tmp_path / "c.db").calls(session="s1")}
    assert rows[first]["completion_ids"] == [7, 8]
    assert [r["prompt_ids"] for r in rows.values()] == [prompt, [*prompt, 7, 8, 9]]
