"""Capture shards (`polar proxy --workers`): names, row id ranges, reading the set as one."""

from __future__ import annotations

import pytest

from polar.capture.shards import SHARD_ID_SPAN, CaptureShards, find_shards, open_captures, shard_index, shard_path
from polar.sqlite_files import WrongDatabase
from tests.support.captures import Recorder


def test_shard_names_follow_the_db():
    assert shard_path("/runs/captures.db", 3).as_posix() == "/runs/captures.w3.db"
    assert shard_index("/runs/captures.w12.db") == 12 and shard_index("/runs/captures.db") is None


def test_each_shard_writes_in_its_own_id_range_and_reads_as_one(tmp_path):
    db = tmp_path / "captures.db"
    plain, w0, w1 = Recorder(db), Recorder(shard_path(db, 0)), Recorder(shard_path(db, 1))
    ids = {"plain": plain.call("p", [1, 2], [3]), "w1": w1.call("b", [1, 2], [3]),
           "w0": w0.call("a", [1, 2], [3])}
    ids["w0 turn 2"] = w0.call("a", [1, 2, 3, 4], [5])  # the next row follows in the range, against its parent
    for recorder in (plain, w0, w1):
        recorder.close()
    assert ids == {"plain": 1, "w0": SHARD_ID_SPAN + 1, "w0 turn 2": SHARD_ID_SPAN + 2, "w1": 2 * SHARD_ID_SPAN + 1}

    (tmp_path / "captures.w.db").touch()  # not a shard name: left out
    assert find_shards(db) == [db, shard_path(db, 0), shard_path(db, 1)]
    store = open_captures(db)
    assert isinstance(store, CaptureShards)
    rows = list(store.calls())
    assert [r["id"] for r in rows] == sorted(ids.values())
    assert [r["prompt_ids"] for r in rows if r["session_id"] == "a"] == [[1, 2], [1, 2, 3, 4]]
    assert [r["session_id"] for r in open_captures(db).calls(session="b")] == ["b"]


def test_a_single_database_reads_as_before_and_nothing_is_a_clear_error(tmp_path):
    Recorder(tmp_path / "one.db").close()
    assert not isinstance(open_captures(tmp_path / "one.db"), CaptureShards)
    with pytest.raises(WrongDatabase, match="nor worker shards"):
        open_captures(tmp_path / "missing.db")
