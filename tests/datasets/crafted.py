"""Hand-built session results for the selection, RL and CLI tests (no capture store behind them)."""

from __future__ import annotations

from polar.rollout.tasks import SessionResult
from polar.trajectories.model import Trajectory, Turn


def trajectory(tid: str, session: str, task: str, tokens: list[int], sampled: int, reward: float | None = 1.0,
               **flags) -> Trajectory:
    """`tokens`, of which the last `sampled` were sampled in one turn."""
    n = len(tokens)
    return Trajectory(
        id=tid, builder="prefix-merge", session_id=session, task=task, token_ids=tokens,
        loss_mask=[0] * (n - sampled) + [1] * sampled, logprobs=[0.0] * (n - sampled) + [-0.5] * sampled,
        turns=[Turn(row_id=1, call_id=f"{tid}-c", prompt_start=0, completion_start=n - sampled, completion_end=n,
                    finish_reason="length" if flags.get("truncated") else "stop")],
        reward=reward, **flags)


def result(task: str, sample: int, reward: float | None = 1.0, outcome: str = "ok", tokens: list[int] | None = None,
           extra: int = 0, **flags) -> SessionResult:
    """A session of `task` with one trajectory (plus `extra` more, distinct) and this reward."""
    session = f"{task}.{sample}"
    base = tokens if tokens is not None else [*map(ord, task), sample, 7, 8, 9]
    trajs = [trajectory(f"{session}#{i}", session, task, base + [100 + i] * i, 2, reward, **flags)
             for i in range(1 + extra)]
    return SessionResult(session_id=session, task_id=task, sample=sample, outcome=outcome, reward=reward,
                         trajectories=trajs, partial=outcome == "timeout")
