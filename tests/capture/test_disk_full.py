"""A real full disk (a tmpfs of its own) under the capture writer: a call whose completion could not be written
leaves no row `pending` once space is back, while the writer goes on."""

from __future__ import annotations

import random

import pytest

from polar.capture.writer import CaptureError, CaptureWriter
from tests.capture.test_writer import _end, _rows, _start
from tests.support.captures import finish_now
from tests.support.disk import fill, small_tmpfs


@pytest.fixture
def small_disk(tmp_path):
    with small_tmpfs(tmp_path / "disk") as mnt:
        yield mnt


def test_a_call_whose_completion_hit_a_full_disk_is_marked_failed_once_space_is_back(small_disk):
    writer = CaptureWriter(small_disk / "c.db")
    finish_now(writer, writer.start(_start("before")), _end())
    arrival = writer.start(_start("lost"))  # its pending row is written while there is space
    assert arrival.row_id is not None
    fill(small_disk)
    # More than the WAL's presized pages hold, even compressed: the completion's transaction cannot commit.
    with pytest.raises(CaptureError, match="full"):
        finish_now(writer, arrival, _end(response_body=random.Random(0).randbytes(8_000_000)))
    assert _rows(small_disk / "c.db")["lost"]["status"] == "pending"  # nothing more can be written yet
    (small_disk / "filler").unlink()
    finish_now(writer, writer.start(_start("after")), _end())  # the next commit settles it
    rows = _rows(small_disk / "c.db")
    assert rows["before"]["status"] == rows["after"]["status"] == "ok"
    assert (rows["lost"]["status"], rows["lost"]["error_kind"]) == ("error", "capture_failed")
    assert "polar could not record this call" in rows["lost"]["error"] and "full" in rows["lost"]["error"]
    writer.close()
