"""The rollout server's durable state: submitted tasks, where each session is, results not drained.

Everything the server must not lose on a crash is committed before it is acknowledged: a task
before `submit` returns, a result before any client can see it. After a restart, sessions that
were still in flight start again from scratch (their sandboxes died with the server) and results
the trainer has not acknowledged are served again.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import sqlite_utils

from polar.rollout.tasks import SessionResult, SessionSpec, Stage, TaskSpec

_TERMINAL: Stage = "done"


class RolloutState:
    def __init__(self, path: str | Path):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False, timeout=30)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")  # a result acknowledged is a result kept
        self.db = sqlite_utils.Database(conn)
        # One connection shared by the event loop and worker threads: every use holds the lock.
        self._lock = threading.RLock()
        self._create()

    def _create(self) -> None:
        if not self.db["tasks"].exists():
            self.db["tasks"].create({"id": str, "spec": str, "submitted": float, "cancelled": int}, pk="id")
        if not self.db["sessions"].exists():
            self.db["sessions"].create(
                {"session_id": str, "task_id": str, "sample": int, "spec": str, "stage": str, "outcome": str,
                 "updated": float},
                pk="session_id",
            )
            self.db["sessions"].create_index(["task_id"])
            self.db["sessions"].create_index(["stage"])
        if not self.db["results"].exists():
            self.db["results"].create(
                {"seq": int, "session_id": str, "task_id": str, "outcome": str, "reward": float, "body": str,
                 "drained": int, "finished": float},
                pk="seq",
            )
            self.db["results"].create_index(["session_id"], unique=True)
            self.db["results"].create_index(["drained", "seq"])
        if not self.db["meta"].exists():
            self.db["meta"].create({"key": str, "value": str}, pk="key")

    def _write(self, fn) -> Any:
        with self._lock, self.db.conn:  # one transaction per call
            return fn()

    def _read(self, sql: str, params: list | tuple = ()) -> list[dict[str, Any]]:
        with self._lock:
            return list(self.db.query(sql, params))

    # -- tasks and sessions ----------------------------------------------------------------

    def has_task(self, task_id: str) -> bool:
        return bool(self._read("SELECT 1 FROM tasks WHERE id = ?", [task_id]))

    def add_task(self, task: TaskSpec) -> list[SessionSpec]:
        if self.has_task(task.id):
            raise ValueError(f"task id {task.id!r} was already submitted")
        sessions = SessionSpec.expand(task)
        now = time.time()

        def write() -> None:
            self.db["tasks"].insert({"id": task.id, "spec": task.model_dump_json(), "submitted": now, "cancelled": 0})
            self.db["sessions"].insert_all(
                {"session_id": s.session_id, "task_id": task.id, "sample": s.sample, "spec": s.model_dump_json(),
                 "stage": "queued", "outcome": None, "updated": now}
                for s in sessions
            )

        self._write(write)
        return sessions

    def set_stage(self, session_id: str, stage: Stage) -> None:
        self._write(lambda: self.db["sessions"].update(session_id, {"stage": stage, "updated": time.time()}))

    def cancel_task(self, task_id: str) -> list[str]:
        """Mark a task cancelled; returns its sessions that had not finished."""
        if not self.has_task(task_id):
            raise KeyError(task_id)
        self._write(lambda: self.db["tasks"].update(task_id, {"cancelled": 1}))
        rows = self._read("SELECT session_id FROM sessions WHERE task_id = ? AND stage != ?", [task_id, _TERMINAL])
        return [r["session_id"] for r in rows]

    def unfinished(self) -> list[SessionSpec]:
        """Sessions not done, oldest first."""
        rows = self._read("SELECT spec FROM sessions WHERE stage != ? ORDER BY rowid", [_TERMINAL])
        return [SessionSpec.model_validate_json(r["spec"]) for r in rows]

    def requeue(self, session_ids: list[str] | None = None) -> list[SessionSpec]:
        """Unfinished sessions (all, or these) start again as new attempts: after a restart, or off a
        node the service lost (their sandboxes are gone, or no longer heard from)."""
        wanted = None if session_ids is None else set(session_ids)
        specs = [s.model_copy(update={"attempt": s.attempt + 1}) for s in self.unfinished()
                 if wanted is None or s.session_id in wanted]

        def write() -> None:
            for s in specs:
                self.db["sessions"].update(s.session_id, {"spec": s.model_dump_json(), "stage": "queued",
                                                          "updated": time.time()})

        self._write(write)
        return specs

    # -- results ---------------------------------------------------------------------------

    def put_result(self, result: SessionResult) -> int:
        """Store a finished session's result (once: a replayed session keeps its first result)."""

        def write() -> int:
            existing = self._read("SELECT seq FROM results WHERE session_id = ?", [result.session_id])
            if existing:
                return existing[0]["seq"]
            seq = self.db["results"].insert(
                {"session_id": result.session_id, "task_id": result.task_id, "outcome": result.outcome,
                 "reward": result.reward, "body": result.model_dump_json(), "drained": 0, "finished": time.time()}
            ).last_pk
            self.db["sessions"].update(result.session_id, {"stage": _TERMINAL, "outcome": result.outcome,
                                                           "updated": time.time()})
            return seq

        return self._write(write)

    def results(self, after: int = 0, undrained_only: bool = True, limit: int = 100) -> list[tuple[int, SessionResult]]:
        where = "seq > ?" + (" AND drained = 0" if undrained_only else "")
        rows = self._read(f"SELECT seq, body FROM results WHERE {where} ORDER BY seq LIMIT ?", [after, limit])
        return [(r["seq"], SessionResult.model_validate_json(r["body"])) for r in rows]

    def all_results(self) -> list[SessionResult]:
        """Every result kept, drained or not, in completion order."""
        rows = self._read("SELECT body FROM results ORDER BY seq")
        return [SessionResult.model_validate_json(r["body"]) for r in rows]

    def ack(self, seqs: list[int]) -> int:
        """The trainer has these results: they are no longer served to a new stream."""
        if not seqs:
            return 0
        marks = ",".join("?" * len(seqs))
        sql = f"UPDATE results SET drained = 1 WHERE seq IN ({marks})"
        return self._write(lambda: self.db.execute(sql, seqs).rowcount)

    # -- status and settings ---------------------------------------------------------------

    def counts(self) -> dict[str, Any]:
        stages = {r["stage"]: r["n"] for r in self._read("SELECT stage, count(*) n FROM sessions GROUP BY stage")}
        by_outcome = self._read("SELECT outcome, count(*) n FROM results GROUP BY outcome")
        (rewards,) = self._read("SELECT count(reward) n, avg(reward) mean FROM results")
        (undrained,) = self._read("SELECT count(*) n FROM results WHERE drained = 0")
        (tasks,) = self._read("SELECT count(*) n FROM tasks")
        return {"stages": stages, "outcomes": {r["outcome"]: r["n"] for r in by_outcome}, "rewards": rewards,
                "undrained": undrained["n"], "tasks": tasks["n"]}

    def get(self, key: str, default: str | None = None) -> str | None:
        rows = self._read("SELECT value FROM meta WHERE key = ?", [key])
        return rows[0]["value"] if rows else default

    def put(self, key: str, value: str) -> None:
        self._write(lambda: self.db["meta"].upsert({"key": key, "value": value}, pk="key"))

    def close(self) -> None:
        self.db.conn.close()
