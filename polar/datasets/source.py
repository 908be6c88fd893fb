"""Where an export reads from: a rollout state (scored sessions) and a capture store (every call).

Both are opened read-only and checked first, so a wrong path or a file of the wrong kind is a clear
error, never an empty dataset or a fresh database created by accident (`RolloutState` would create
its tables in any file it is given).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from polar.capture.shards import open_captures
from polar.rollout.tasks import SessionResult, harness_name
from polar.sqlite_files import WrongDatabase, open_readonly


class ExportError(ValueError):
    """An export that cannot go ahead; the message says why (the CLI shows it as is)."""


class SourceError(ExportError):
    """A database that cannot be exported from; the message says which and why."""


@dataclass
class SessionRecord:
    """One finished session as the export sees it."""

    result: SessionResult
    harness: str | None  # the harness registry name, from the session's spec (None if the spec is gone)


def _connect_readonly(path: Path, kind: str) -> sqlite3.Connection:
    try:
        return open_readonly(path, kind)
    except WrongDatabase as exc:
        raise SourceError(str(exc)) from None


class RolloutSource:
    """A rollout state database (`polar rollout serve --state …`, `polar demo`), read-only."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.conn = _connect_readonly(self.path, "rollout state")

    def count(self, task_ids: set[str] | None = None) -> int:
        if not task_ids:
            return self.conn.execute("SELECT count(*) FROM results").fetchone()[0]
        marks = ",".join("?" * len(task_ids))
        sql = f"SELECT count(*) FROM results WHERE task_id IN ({marks})"
        return self.conn.execute(sql, sorted(task_ids)).fetchone()[0]

    def harnesses(self) -> dict[str, str | None]:
        """Session id → harness name, from the specs the sessions ran (None for a spec it cannot read)."""
        rows = self.conn.execute("SELECT session_id, spec FROM sessions")
        return {session_id: harness_name(spec) for session_id, spec in rows}

    def records(self, task_ids: set[str] | None = None) -> Iterator[SessionRecord]:
        """Every stored result in completion order (drained or not)."""
        harnesses = self.harnesses()
        for seq, body in self.conn.execute("SELECT seq, body FROM results ORDER BY seq"):
            try:
                result = SessionResult.model_validate_json(body)
            except ValueError as exc:
                raise SourceError(f"{self.path}: result #{seq} is not a session result this polar reads: "
                                  f"{str(exc).splitlines()[0]}") from None
            if task_ids and result.task_id not in task_ids:
                continue
            yield SessionRecord(result, harnesses.get(result.session_id))

    def close(self) -> None:
        self.conn.close()


class CaptureSource:
    """A capture database (`captures.db`), read-only: the calls behind each trajectory's turns."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        try:  # the database, or every worker's shard of it (`polar proxy --workers`)
            self.store = open_captures(self.path)
        except WrongDatabase as exc:
            raise SourceError(str(exc)) from None
        self._session: str | None = None
        self._rows: dict[int, dict[str, Any]] = {}

    def rows(self, session_id: str) -> dict[int, dict[str, Any]]:
        """A capture session's calls by row id (token arrays left out: the trajectory holds them).
        The last session read is kept: an export reads a session's trajectories one after another."""
        if session_id != self._session:
            self._rows = {r["id"]: r for r in self.store.calls(session=session_id, with_tokens=False)}
            self._session = session_id
        return self._rows

    def close(self) -> None:
        self._rows = {}
