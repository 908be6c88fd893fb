"""`policy_version` (the trainer's step, an INTEGER column) and `weight_version` (the upstream's own label for
its weights): a database from before, whose TEXT `policy_version` held either, reads as the current layout
read-only, and a writer migrates it once: digits become the int, labels move to `weight_version`."""

from __future__ import annotations

import sqlite3

from polar.canonical import ChatResult
from polar.capture.reader import CaptureReader
from polar.trajectories.builders import prefix_merge
from tests.support.captures import Recorder

# The calls table as the writer created it before `policy_version` was an int (and `weight_version` existed).
OLD_CALLS = """CREATE TABLE "calls" (
   "id" INTEGER PRIMARY KEY, "call_id" TEXT NOT NULL, "session_id" TEXT NOT NULL, "writer" TEXT, "provider" TEXT,
   "endpoint" TEXT, "path" TEXT, "model" TEXT, "upstream_model" TEXT, "stream" INTEGER,
   "status" TEXT NOT NULL DEFAULT 'pending', "http_status" INTEGER, "error_kind" TEXT, "error" TEXT, "client" TEXT,
   "key_hash" TEXT, "request_headers" TEXT, "request_body" BLOB, "body_encoding" TEXT, "body_id" INTEGER,
   "canonical" TEXT, "rewrites" TEXT, "result" TEXT, "response_body" BLOB, "response_encoding" TEXT,
   "response_body_id" INTEGER, "prompt_parent" INTEGER, "prompt_prefix_len" INTEGER, "prompt_suffix" BLOB,
   "prompt_encoding" TEXT, "prompt_len" INTEGER, "completion_ids" BLOB, "completion_logprobs" BLOB,
   "completion_encoding" TEXT, "completion_len" INTEGER, "finish_reason" TEXT, "policy_version" TEXT,
   "prompt_mode" TEXT, "replica" TEXT, "t_start" REAL, "t_upstream" REAL, "t_first" REAL, "t_end" REAL
)"""
OLD_INDEXES = ['CREATE UNIQUE INDEX "idx_calls_call_id" ON "calls" ("call_id")',
               'CREATE INDEX "idx_calls_session_id_id" ON "calls" ("session_id", "id")',
               'CREATE INDEX "idx_calls_status" ON "calls" ("status")']
# (the old policy_version column: the gate's str(step), vLLM's label, or a label a trainer gave the gate;
#  the label vLLM reported, which the result JSON named policy_version)
OLD_VERSIONS = [("3", "3"), ("default", "default"), ("step-42", "default"), (None, None)]


def _old_database(path) -> None:
    """One session of four calls, stored as a writer from before stored them."""
    rec = Recorder(path)
    prompt = [1, 2]
    for n, (_, label) in enumerate(OLD_VERSIONS):
        result = {"id": f"r{n}", "model": "m", "created": 0, "content": f"turn {n}",
                  **({"policy_version": label} if label is not None else {})}
        rec.call("s", prompt, [10 + n, 2], [{"role": "user", "content": f"turn {n}"}], result=result)
        prompt = [*prompt, 10 + n, 2, 3]
    rec.close()
    conn = sqlite3.connect(path)
    columns = [name for _, name, *_ in conn.execute("PRAGMA table_info(calls)") if name != "weight_version"]
    conn.execute("ALTER TABLE calls RENAME TO calls_now")
    for (index,) in conn.execute("SELECT name FROM sqlite_master WHERE type='index' AND tbl_name='calls_now'").fetchall():
        conn.execute(f'DROP INDEX "{index}"')
    for sql in [OLD_CALLS, *OLD_INDEXES]:
        conn.execute(sql)
    conn.execute(f"INSERT INTO calls ({', '.join(columns)}) SELECT {', '.join(columns)} FROM calls_now")
    conn.execute("DROP TABLE calls_now")
    conn.executemany("UPDATE calls SET policy_version=? WHERE id=?",
                     [(stored, n + 1) for n, (stored, _) in enumerate(OLD_VERSIONS)])
    conn.commit()
    conn.close()


def _column(path, sql: str) -> list:
    with sqlite3.connect(path) as conn:
        return [value for (value,) in conn.execute(sql)]


def _schema(path) -> list[str]:
    return _column(path, "SELECT sql FROM sqlite_master WHERE tbl_name='calls' ORDER BY name")


def test_a_database_from_before_reads_as_the_current_layout_and_a_writer_migrates_it(tmp_path):
    path = tmp_path / "old.db"
    _old_database(path)
    assert _column(path, "SELECT typeof(policy_version) FROM calls ORDER BY id") == ["text"] * 3 + ["null"]
    old_schema = _schema(path)

    before = list(CaptureReader(path).calls())  # read-only: nothing migrated yet
    assert _schema(path) == old_schema
    assert [(r["policy_version"], r["weight_version"]) for r in before] == [
        (3, None), (None, "default"), (None, "step-42"), (None, None)]
    results = [ChatResult.model_validate(r["result"]) for r in before]  # as previous_response_id reads them
    assert [r.weight_version for r in results] == ["3", "default", "default", None]
    assert all("policy_version" not in r["result"] for r in before)

    rec = Recorder(path)  # the writer migrates, once
    types = {name: kind for _, name, kind, *_ in sqlite3.connect(path).execute("PRAGMA table_info(calls)")}
    assert (types["policy_version"], types["weight_version"]) == ("INTEGER", "TEXT")
    assert _column(path, "SELECT typeof(policy_version) FROM calls ORDER BY id") == ["integer", "null", "null", "null"]
    assert _column(path, "SELECT weight_version FROM calls ORDER BY id") == [None, "default", "step-42", None]
    assert sorted(_column(path, "SELECT name FROM sqlite_master WHERE type='index' AND tbl_name='calls'")) == [
        "idx_calls_call_id", "idx_calls_session_id_id", "idx_calls_status"]
    assert list(CaptureReader(path).calls()) == before  # nothing captured is lost or changed in the move

    rec.call("s", [1, 2, 10, 2, 3, 11, 2, 3, 12, 2, 3, 13, 2, 3], [14, 2], [{"role": "user", "content": "turn 4"}],
             policy=4)
    rec.close()
    migrated = _schema(path)
    Recorder(path).close()  # an up-to-date database is left as it is
    assert _schema(path) == migrated
    (trajectory,) = prefix_merge(list(CaptureReader(path).calls()))
    assert [t.policy_version for t in trajectory.turns] == [3, None, None, None, 4]
    assert trajectory.policy_version is None


def test_the_trainers_step_and_the_upstreams_label_are_written_to_their_own_columns(tmp_path):
    rec = Recorder(tmp_path / "c.db")
    end = rec._end("ok", None, None, None, policy_version=0, weight_version="0")
    rec._write("s", end, "test")
    rec.close()
    (row,) = CaptureReader(tmp_path / "c.db").calls(session="s", with_tokens=False)
    assert (row["policy_version"], row["weight_version"]) == (0, "0")
    assert _column(tmp_path / "c.db", "SELECT typeof(policy_version) FROM calls") == ["integer"]
