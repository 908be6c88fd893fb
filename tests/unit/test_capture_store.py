"""The capture store: linear token storage, durability, crash marking, session scoping."""

from __future__ import annotations

import asyncio
import json
import sqlite3

import numpy as np

from polar.capture.store import CaptureStore
from polar.capture.tokens import PrefixIndex, common_prefix_len, pack_ids, unpack_ids


def _call(store: CaptureStore, session: str, prompt: list[int], completion: list[int]) -> int:
    row_id = store.allocate_id()
    store.begin({"id": row_id, "call_id": f"c{row_id}", "session_id": session, "provider": "test", "status": "pending"})
    fields = store.tokens_fields(session, row_id, prompt, completion, [-0.5] * len(completion))
    asyncio.run(store.finish(row_id, {"status": "ok", **fields}))
    return row_id


def test_pack_roundtrip_and_prefix():
    ids = [0, 1, 248045, 2**32 - 1]
    assert unpack_ids(pack_ids(ids)) == ids
    a, b = np.array([1, 2, 3, 4], "<u4"), np.array([1, 2, 9], "<u4")
    assert common_prefix_len(a, b) == 2 and common_prefix_len(a, a[:0]) == 0


def test_growing_session_is_stored_linearly(tmp_path):
    store = CaptureStore(tmp_path / "c.db")
    prompt, total_new = list(range(100)), 0
    rows = []
    for turn in range(20):
        completion = [1000 + turn * 10 + i for i in range(10)]
        rows.append(_call(store, "s1", prompt, completion))
        total_new += 10
        prompt = prompt + completion + [5000 + turn] * 5  # next prompt extends prompt+completion
    conn = sqlite3.connect(tmp_path / "c.db")
    stored = conn.execute("SELECT sum(length(prompt_suffix)) / 4 FROM calls").fetchone()[0]
    # Only the first prompt and the 5 new ids per turn are stored, not 20 growing prompts.
    assert stored == 100 + 19 * 5
    by_id = {r["id"]: r for r in store.calls(session="s1")}
    expected = list(range(100))
    for turn, row_id in enumerate(rows):
        assert by_id[row_id]["prompt_ids"] == expected
        expected = expected + by_id[row_id]["completion_ids"] + [5000 + turn] * 5
    store.close()


def test_interleaved_lineages_find_their_own_parent(tmp_path):
    store = CaptureStore(tmp_path / "c.db")
    main = _call(store, "s", [1, 2, 3], [4])
    sub = _call(store, "s", [9, 9, 9], [8])  # a sub-agent: unrelated prompt
    main2 = _call(store, "s", [1, 2, 3, 4, 5], [6])
    sub2 = _call(store, "s", [9, 9, 9, 8, 7], [6])
    rows = {r["id"]: r for r in store.calls()}
    assert rows[main2]["prompt_parent"] == main and rows[sub2]["prompt_parent"] == sub
    assert rows[main2]["prompt_ids"] == [1, 2, 3, 4, 5] and rows[sub2]["prompt_ids"] == [9, 9, 9, 8, 7]
    store.close()


def test_restart_relearns_lineage_and_marks_interrupted(tmp_path):
    store = CaptureStore(tmp_path / "c.db")
    first = _call(store, "s", [1, 2, 3], [4, 5])
    pending = store.allocate_id()
    store.begin({"id": pending, "call_id": "p", "session_id": "s", "provider": "test", "status": "pending"})
    store.close()
    again = CaptureStore(tmp_path / "c.db")
    assert again.mark_interrupted() == 1
    second = _call(again, "s", [1, 2, 3, 4, 5, 6], [7])
    rows = {r["id"]: r for r in again.calls()}
    assert rows[pending]["status"] == "interrupted"
    assert rows[second]["prompt_parent"] == first and rows[second]["prompt_ids"] == [1, 2, 3, 4, 5, 6]
    assert second > pending  # ids never reused after restart
    again.close()


def test_find_call_is_scoped_to_the_session(tmp_path):
    store = CaptureStore(tmp_path / "c.db")
    row_id = _call(store, "alice", [1], [2])
    assert store.find_call(f"c{row_id}", "alice")["id"] == row_id
    assert store.find_call(f"c{row_id}", "mallory") is None
    store.close()


def test_prefix_index_bounds_sessions():
    index = PrefixIndex(max_sessions=2, lineages_per_session=2)
    for s in ("a", "b", "c"):
        index.remember(s, 1, [1], [2])
    assert not index.knows("a") and index.knows("c")


def test_wal_is_presized_so_commits_overwrite_instead_of_growing_it(tmp_path):
    """Appending commits pay a metadata flush in their fsync; a presized WAL is overwritten in place."""
    store = CaptureStore(tmp_path / "c.db")
    wal = tmp_path / "c.db-wal"
    conn = sqlite3.connect(tmp_path / "c.db")
    page, pages = (conn.execute(f"PRAGMA {p}").fetchone()[0] for p in ("page_size", "wal_autocheckpoint"))
    size = wal.stat().st_size
    assert size >= page * pages
    for i in range(300):
        _call(store, "s1", list(range(50 + i)), [7, 8, 9])
    assert wal.stat().st_size == size
    assert conn.execute("SELECT count(*) FROM calls").fetchone()[0] == 300
    assert "_polar_wal_presize" not in {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
    conn.close()
    store.close()
    CaptureStore(tmp_path / "c.db").close()  # reopening an existing store works and keeps its rows
    assert sqlite3.connect(tmp_path / "c.db").execute("SELECT count(*) FROM calls").fetchone()[0] == 300


def test_canonical_messages_are_stored_once_and_read_back_exactly(tmp_path):
    """A turn re-sends the whole history: each message is stored once, an edited one again, and every
    row reads back its own conversation (also when sessions interleave)."""
    store = CaptureStore(tmp_path / "c.db")

    def msg(role: str, text: str) -> dict:
        return {"role": role, "content": [{"type": "text", "text": text}]}

    def call(session: str, messages: list[dict]) -> int:
        row_id = store.allocate_id()
        store.begin({"id": row_id, "call_id": f"c{row_id}", "session_id": session, "provider": "t", "status": "pending"})
        asyncio.run(store.finish(row_id, {"status": "ok", "canonical": {"model": "m", "messages": messages}}))
        return row_id

    history = [msg("system", "be brief"), msg("user", "hi")]
    sent = {}
    for turn in range(4):
        history = history + [msg("assistant", f"answer {turn}"), msg("user", f"more {turn}")]
        sent[call("a", history)] = history
        other = [msg("user", f"b {turn}")]  # another session in between
        sent[call("b", other)] = other
    edited = [msg("system", "be brief"), msg("user", "hi, edited"), *history[2:]]
    sent[call("a", edited)] = edited

    rows = {r["id"]: r for r in store.calls()}
    assert {i: rows[i]["canonical"]["messages"] for i in sent} == sent
    conn = sqlite3.connect(tmp_path / "c.db")
    distinct = {json.dumps(m, sort_keys=True) for messages in sent.values() for m in messages}
    assert conn.execute("SELECT count(*) FROM messages").fetchone()[0] == len(distinct)
    conn.close()
    store.close()
