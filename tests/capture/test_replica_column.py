"""The `replica` column (which fleet replica answered or failed a call): written, and migrated into a
database from before it without touching what the database holds."""

from __future__ import annotations

import sqlite3

from polar.capture.reader import CaptureReader
from tests.support.captures import Recorder


def test_a_database_from_before_the_replica_column_reads_and_takes_it_on(tmp_path):
    rec = Recorder(tmp_path / "c.db")
    rec.call("s1", [1, 2, 3], [4, 5])
    rec.close()
    conn = sqlite3.connect(tmp_path / "c.db")  # as a writer from before stored it
    conn.execute("ALTER TABLE calls DROP COLUMN replica")
    conn.commit()
    conn.close()
    (row,) = CaptureReader(tmp_path / "c.db").calls(session="s1")
    assert "replica" not in row and row["prompt_ids"] == [1, 2, 3] and row["completion_ids"] == [4, 5]
    rec = Recorder(tmp_path / "c.db")  # the writer adds the column; the old row reads NULL there
    rec.call("s1", [1, 2, 3, 4, 5, 6], [7])
    rec.close()
    rows = list(CaptureReader(tmp_path / "c.db").calls(session="s1"))
    assert [r["replica"] for r in rows] == [None, None]
    assert rows[1]["prompt_ids"] == [1, 2, 3, 4, 5, 6]


def test_the_replica_is_written(tmp_path):
    rec = Recorder(tmp_path / "c.db")
    end = rec._end("error", None, None, None, error_kind="upstream_unavailable", error="refused",
                   replica="http://10.0.0.2:8000")
    rec._write("s1", end, "test")
    rec.close()
    (row,) = CaptureReader(tmp_path / "c.db").calls(session="s1")
    assert row["replica"] == "http://10.0.0.2:8000" and row["error_kind"] == "upstream_unavailable"
