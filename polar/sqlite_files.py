"""Opening polar's own SQLite files read-only, once they are known to be what they were given as.

Readers beside a run (export, report) must never create or change a database: a wrong path or a
file of the other kind is a clear error, not an empty result or a fresh file. A capture database
given where a rollout state belongs (or the reverse) is named as such.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

# The tables and columns each kind is recognised by (what its readers rely on).
KINDS: dict[str, dict[str, set[str]]] = {
    "rollout state": {"tasks": {"id", "spec"}, "sessions": {"session_id", "task_id", "stage", "spec"},
                      "results": {"seq", "session_id", "body"}},
    "capture": {"calls": {"id", "session_id", "status", "prompt_len", "completion_len", "t_start", "t_end"},
                "messages": {"hash", "body"}},
}


class WrongDatabase(ValueError):
    """The file is missing, not SQLite, or not the polar database it was given as."""


def open_readonly(path: str | Path, kind: str) -> sqlite3.Connection:
    """A read-only connection to `path`, a polar database of `kind` (a key of KINDS)."""
    path = Path(path)
    if not path.is_file():
        raise WrongDatabase(f"no {kind} database at {path}")
    try:
        conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=30)
        columns = _columns(conn)
    except sqlite3.DatabaseError as exc:
        raise WrongDatabase(f"{path} is not a polar {kind} database: it is not an SQLite database ({exc})") from None
    missing = _missing(columns, KINDS[kind])
    if not missing:
        return conn
    conn.close()
    for other, tables in KINDS.items():
        if other != kind and not _missing(columns, tables):
            raise WrongDatabase(f"{path} is not a polar {kind} database; it is a {other} database")
    listed = "; ".join(f"{t}({', '.join(sorted(cols))})" for t, cols in sorted(missing.items()))
    raise WrongDatabase(f"{path} is not a polar {kind} database (missing: {listed})")


def _missing(columns: dict[str, set[str]], tables: dict[str, set[str]]) -> dict[str, set[str]]:
    return {t: cols - columns.get(t, set()) for t, cols in tables.items() if not cols <= columns.get(t, set())}


def _columns(conn: sqlite3.Connection) -> dict[str, set[str]]:
    names = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")]
    return {name: {r[1] for r in conn.execute(f"PRAGMA table_info({json.dumps(name)})")} for name in names}
