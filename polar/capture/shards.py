"""Capture shards: `polar proxy --workers N --db captures.db` writes `captures.w0.db` … `captures.w<N-1>.db`.

One writer per file, one file per worker process (the writer allocates row ids and keeps delta bases in
memory). Shard k's row ids start after (k + 1) × SHARD_ID_SPAN, so a row id names one call across the
whole set (and the plain database beside it),
and a session lives in exactly one shard (the front's affinity). Readers given the `--db` the proxy got
read every shard of it (`open_captures`), the plain file too when it exists.
"""

from __future__ import annotations

import glob
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from polar.capture.reader import CaptureReader
from polar.sqlite_files import WrongDatabase

SHARD_ID_SPAN = 10**12  # rows per shard before its ids would meet the next shard's
_SHARD = re.compile(r"\.w(\d+)$")


def shard_path(db: str | Path, index: int) -> Path:
    """Worker `index`'s file: captures.db → captures.w<index>.db (beside it)."""
    db = Path(db)
    return db.with_name(f"{db.stem}.w{index}{db.suffix}")


def shard_index(path: str | Path) -> int | None:
    """Which worker's shard a file is, by its name; None for a plain capture database."""
    m = _SHARD.search(Path(path).stem)
    return int(m.group(1)) if m else None


def first_row_id(path: str | Path) -> int:
    """The row id a new database at `path` starts after: 0, or the start of its shard's range."""
    index = shard_index(path)
    return 0 if index is None else (index + 1) * SHARD_ID_SPAN


def find_shards(db: str | Path) -> list[Path]:
    """The plain database (if there) and every shard of it, in worker order."""
    db = Path(db)
    shards = []
    for path in db.parent.glob(f"{glob.escape(db.stem)}.w*{glob.escape(db.suffix)}"):
        index = shard_index(path)
        if index is not None and path.name == shard_path(db, index).name:
            shards.append((index, path))
    return ([db] if db.is_file() else []) + [p for _, p in sorted(shards)]


class CaptureShards:
    """Several capture databases read as one: rows of every shard, in row id order within each shard."""

    def __init__(self, paths: list[Path]):
        self.readers = [CaptureReader(p) for p in paths]
        self.path = ", ".join(str(p) for p in paths)

    def calls(self, session: str | None = None, with_tokens: bool = True) -> Iterator[dict[str, Any]]:
        for reader in self.readers:
            yield from reader.calls(session=session, with_tokens=with_tokens)


def open_captures(db: str | Path) -> CaptureReader | CaptureShards:
    """The capture database at `db`, or the shard set a `polar proxy --workers` wrote for that `--db`."""
    paths = find_shards(db)
    if not paths:
        raise WrongDatabase(f"no capture database at {db}, nor worker shards of it ({shard_path(db, 0).name}, …)")
    return CaptureReader(paths[0]) if paths == [Path(db)] else CaptureShards(paths)
