"""Everything a run report shows, read from a rollout state DB and/or a capture DB (no rendering here).

The rollout state knows each session's task, harness, outcome, reward, stage timings and the
prefix-merge trajectories it was scored with. The capture DB knows every model call (failed ones
too), its timing and its tokens; from it alone the trajectories are rebuilt and the drift report
computed. With both, a session's capture rows are matched to its result by session id (a retried
session's calls are captured under `<session>.r<attempt>`, see SessionSpec.capture_id).
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from polar.capture.shards import open_captures
from polar.reporting.replicas import ReplicaStats, replica_stats
from polar.rollout.tasks import SessionResult, harness_name
from polar.sqlite_files import WrongDatabase, open_readonly
from polar.trajectories.builders import by_session, is_failed, is_sample, prefix_merge
from polar.trajectories.drift import Decoder, SessionDrift, drift_report
from polar.trajectories.model import Trajectory
from polar.verify.errors import VerifyError
from polar.verify.results import Verification

_KINDS = {"state": "rollout state", "captures": "capture"}  # report input → polar.sqlite_files kind
_RETRY = re.compile(r"\.r\d+$")


class ReportInputError(ValueError):
    """An input that is missing or is not the polar database it was given as."""

    def __init__(self, message: str, source: str | None = None):
        super().__init__(message)
        self.source = source  # "state" | "captures" | None (both missing)


@dataclass
class CallTime:
    seconds: float  # arrival to answer, as polar saw it
    upstream: float  # of which, waiting for the upstream (vLLM)


@dataclass
class SessionStats:
    """One session, from whichever inputs know it."""

    session_id: str
    task_id: str | None = None
    harness: str | None = None  # the task's harness; with captures only, the provider format
    stage: str | None = None  # where the rollout state has it (done, running, …)
    result: SessionResult | None = None
    trajectories: list[Trajectory] = field(default_factory=list)
    calls: int | None = None  # captured calls (None: no capture DB)
    failed_calls: int | None = None  # of those, calls that produced no answer
    prompt_tokens_sent: int | None = None  # summed over calls: histories repeat, so far above the context
    call_times: list[CallTime] = field(default_factory=list)

    @property
    def outcome(self) -> str | None:
        return self.result.outcome if self.result else None

    @property
    def reward(self) -> float | None:
        return self.result.reward if self.result else None

    @property
    def timings(self) -> dict[str, float]:
        return self.result.timings if self.result else {}

    @property
    def turns(self) -> int:
        """Sampled calls that made it into a trajectory."""
        return sum(len(t.turns) for t in self.trajectories)

    @property
    def turns_without_logprobs(self) -> int:
        """Turns whose upstream returned no logprobs (null in the trajectory, never 0.0)."""
        return sum(t.turns_without_logprobs for t in self.trajectories)

    @property
    def sampled_tokens(self) -> int:
        return sum(t.trainable_tokens for t in self.trajectories)

    @property
    def context_tokens(self) -> int:
        """Masked tokens, each counted once: a fork's inherited prefix belongs to its parent."""
        total = sum(len(t.token_ids) - (t.lineage.fork_position if t.lineage else 0) for t in self.trajectories)
        return total - self.sampled_tokens

    @property
    def forks(self) -> int:
        return sum(t.lineage is not None for t in self.trajectories)

    @property
    def roots(self) -> int:
        return len(self.trajectories) - self.forks

    @property
    def broken(self) -> int:
        return sum(t.broken_prefix for t in self.trajectories)

    @property
    def truncated(self) -> int:
        return sum(t.truncated for t in self.trajectories)

    @property
    def partial(self) -> int:
        return sum(t.partial for t in self.trajectories)


@dataclass
class RunData:
    state_path: Path | None
    captures_path: Path | str | None  # several (a --ray run's nodes' databases): their paths, comma-separated
    sessions: list[SessionStats]
    drift: list[SessionDrift] | None  # None without a capture DB
    capture_span: tuple[float, float] | None = None  # first call's start, last call's end (epoch seconds)
    verification: Verification | None = None  # `polar verify --json` results, when given
    replicas: list[ReplicaStats] = field(default_factory=list)  # per fleet replica, when the run had a fleet

    @property
    def has_state(self) -> bool:
        return self.state_path is not None

    @property
    def has_captures(self) -> bool:
        return self.captures_path is not None

    @property
    def results(self) -> list[SessionResult]:
        return [s.result for s in self.sessions if s.result is not None]

    @property
    def trajectories(self) -> list[Trajectory]:
        return [t for s in self.sessions for t in s.trajectories]

    @property
    def breaks(self) -> int:
        return sum(len(d.breaks) for d in self.drift or [])

    def add_replica_metrics(self, metrics: dict[str, dict[str, float] | None]) -> None:
        """Each fleet replica's vLLM metrics (by URL) onto its row; a replica no capture names gets one."""
        by_url = {r.replica: r for r in self.replicas}
        for url, found in metrics.items():
            if url not in by_url:
                by_url[url] = ReplicaStats(url)
                self.replicas.append(by_url[url])
            by_url[url].metrics = found

    def by_policy_version(self) -> dict[int, list[SessionStats]]:
        """Finished sessions by the policy version they ran under (a trainer's run: its learning curve),
        versions in order; sessions with no version are left out."""
        versions: dict[int, list[SessionStats]] = {}
        for s in self.sessions:
            if s.result is not None and s.result.policy_version is not None:
                versions.setdefault(s.result.policy_version, []).append(s)
        return dict(sorted(versions.items()))


def gather(state: str | Path | None = None, captures: str | Path | Sequence[str | Path] | None = None,
           tokenizer: Decoder | None = None, verification: list[str | Path] | tuple = ()) -> RunData:
    """Read the inputs (at least one DB) into a RunData; bad inputs raise ReportInputError. `captures`: one
    capture DB (and its workers' shards), or several — a `--ray` run's, one per node actor (a session's calls
    are all in one of them)."""
    if isinstance(captures, Sequence) and not isinstance(captures, str):
        captures = [Path(p) for p in captures] or None
    if state is None and captures is None:
        raise ReportInputError("give a rollout state DB, a capture DB, or both")
    try:
        checks = Verification.load(*verification) if verification else None
    except VerifyError as exc:
        raise ReportInputError(str(exc), "verification") from None
    sessions: dict[str, SessionStats] = {}
    if state is not None:
        state = Path(state)
        for stats in _read_state(state):
            sessions[stats.session_id] = stats
    drift, span, replicas = None, None, []
    if captures is not None:
        paths = captures if isinstance(captures, list) else [Path(captures)]
        captures = paths[0] if len(paths) == 1 else ", ".join(str(p) for p in paths)
        rows = [row for path in paths for row in _read_captures(path)]
        _attach_captures(sessions, rows)
        drift = drift_report(rows, tokenizer)
        replicas = replica_stats(rows)
        timed = [r for r in rows if r.get("t_start") is not None]
        if timed:
            span = (min(r["t_start"] for r in timed), max(r.get("t_end") or r["t_start"] for r in timed))
    return RunData(state, captures, list(sessions.values()), drift, span, checks, replicas)


# -- the rollout state ----------------------------------------------------------------------------


def _read_state(path: Path) -> list[SessionStats]:
    conn = _open(path, "state")
    try:
        sessions = conn.execute("SELECT session_id, task_id, stage, spec FROM sessions ORDER BY rowid").fetchall()
        results = conn.execute("SELECT seq, body FROM results ORDER BY seq").fetchall()
    finally:
        conn.close()
    out: dict[str, SessionStats] = {}
    for session_id, task_id, stage, spec in sessions:
        out[session_id] = SessionStats(session_id, task_id=task_id, harness=harness_name(spec), stage=stage)
    for seq, body in results:
        try:
            result = SessionResult.model_validate_json(body)
        except ValidationError as exc:
            raise ReportInputError(f"{path}: result {seq} is not a polar session result: {exc}", "state") from None
        stats = out.setdefault(result.session_id, SessionStats(result.session_id, task_id=result.task_id))
        stats.result = result
        stats.trajectories = list(result.trajectories)
    return list(out.values())


# -- the capture DB -------------------------------------------------------------------------------


def _read_captures(path: Path) -> list[dict[str, Any]]:
    try:  # the database, or every worker's shard of it (`polar proxy --workers`)
        store = open_captures(path)
    except WrongDatabase as exc:
        raise ReportInputError(str(exc), "captures") from None
    try:
        return list(store.calls())
    except sqlite3.DatabaseError as exc:
        raise ReportInputError(f"{path}: cannot read the captured calls: {exc}", "captures") from None


def _attach_captures(sessions: dict[str, SessionStats], rows: Iterable[dict[str, Any]]) -> None:
    """Add each capture session's calls to its rollout session, or make it a session of its own."""
    owner: dict[str, SessionStats] = {}  # capture session id → the session it is reported under
    unscored: list[dict[str, Any]] = []  # rows of sessions no result covers: rebuilt below
    for capture_id, group in by_session(rows).items():
        stats = sessions.get(capture_id) or sessions.get(_RETRY.sub("", capture_id))
        if stats is None:
            stats = sessions[capture_id] = SessionStats(capture_id, harness=group[0].get("provider"))
        owner[capture_id] = stats
        if stats.result is None:
            unscored += group
        stats.calls = (stats.calls or 0) + len(group)
        stats.failed_calls = (stats.failed_calls or 0) + sum(map(is_failed, group))
        stats.prompt_tokens_sent = (stats.prompt_tokens_sent or 0) + sum(r["prompt_len"] for r in group if is_sample(r))
        stats.call_times += [CallTime(r["t_end"] - r["t_start"], r.get("t_upstream") or 0.0)
                             for r in group if r.get("t_end") is not None and r.get("t_start") is not None]
    for traj in prefix_merge(unscored):
        owner[traj.session_id].trajectories.append(traj)


def _open(path: Path, source: str) -> sqlite3.Connection:
    """A read-only connection to `path`, once it is known to hold the source's tables (never creates anything)."""
    try:
        return open_readonly(path, _KINDS[source])
    except WrongDatabase as exc:
        raise ReportInputError(str(exc), source) from None
