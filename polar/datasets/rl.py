"""RL batch rows: scored trajectories grouped for a policy-gradient trainer (GRPO and kin).

A *group* is a task's samples: the sessions `TaskSpec.samples` expanded it into, each run
independently and scored. One row per trajectory (a session can hold several: sub-agents, forks,
a conversation the harness re-rendered), each carrying its session's reward. Group statistics are
taken over sessions, not trajectories, so a session that split into three trajectories does not
count three times:

    advantage = (reward - group_reward_mean) / (group_reward_std + eps)    (scale_by_std=True)
    advantage =  reward - group_reward_mean                                (scale_by_std=False)

with the population standard deviation of the group's session rewards. A group whose sessions all
scored the same has advantage 0 everywhere (no learning signal: trainers usually skip it).

`rl_groups` builds groups from results already in hand (a rollout state, a list); `stream_rl_groups`
pulls them from a running `polar rollout serve` and yields each group once all its sessions have
reported, acknowledging its results only after the consumer has had the group.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from polar.datasets.select import VERIFY_COLUMNS
from polar.rollout.tasks import CUT_OUTCOMES, SessionResult

SCHEMA = pa.schema([
    ("group_id", pa.string()),  # the task id: rows sharing it form one GRPO group
    ("group_size", pa.int32()),  # sessions scored in the group
    ("sample", pa.int32()),  # the session's index within its task
    ("session_id", pa.string()),
    ("trajectory_id", pa.string()),
    ("harness", pa.string()),
    ("input_ids", pa.list_(pa.int32())),
    ("loss_mask", pa.list_(pa.int8())),
    ("logprobs", pa.list_(pa.float32())),  # behaviour policy; 0.0 where masked, null where not captured
    ("has_logprobs", pa.bool_()),  # every turn's logprobs were captured
    ("reward", pa.float64()),
    ("advantage", pa.float64()),
    ("group_reward_mean", pa.float64()),
    ("group_reward_std", pa.float64()),
    ("policy_version", pa.int64()),  # the trainer's step the turns were sampled under (null when they differ)
    ("trainer_policy_version", pa.int64()),  # the trainer's version when the session started
    ("num_turns", pa.int32()),
    ("truncated", pa.bool_()),
    ("cut", pa.string()),  # the watchdog ended the session: looping | stalled | budget (null: not cut)
    *VERIFY_COLUMNS,  # filled by the export when given a verification file
])
# A timed-out session is a scored attempt, not a failure; so is one the watchdog cut, flagged in `cut`
# (a trainer masks or penalises it).
RL_OUTCOMES = frozenset({"ok", "timeout", *CUT_OUTCOMES})


@dataclass
class RLGroup:
    group_id: str
    rows: list[dict[str, Any]]
    sessions: int  # sessions that count (scored, with an accepted outcome)
    reward_mean: float | None
    reward_std: float | None
    dropped: Counter = field(default_factory=Counter)  # sessions left out, by reason
    session_ids: list[str] = field(default_factory=list)  # every session of the group, kept or dropped
    seqs: list[int] = field(default_factory=list)  # the server's result numbers (from `stream_rl_groups`)

    @property
    def has_signal(self) -> bool:
        """Rewards differ within the group (otherwise every advantage is 0)."""
        return bool(self.reward_std)


def _reason_out(result: SessionResult, outcomes: frozenset[str]) -> str | None:
    if result.outcome not in outcomes:
        return f"session {result.outcome}"
    if result.reward is None:
        return "no reward"
    if not any(t.trainable_tokens for t in result.trajectories):
        return "no trainable tokens"
    return None


def rl_group(group_id: str, results: Iterable[SessionResult], *, harness_of: Callable[[str], str | None] | None = None,
             outcomes: frozenset[str] = RL_OUTCOMES, scale_by_std: bool = True, eps: float = 1e-6) -> RLGroup:
    """One group's rows from its sessions' results (sessions that failed or have no reward are
    counted in `dropped`, not trained on)."""
    kept, dropped, session_ids = [], Counter(), []
    for r in results:
        session_ids.append(r.session_id)
        reason = _reason_out(r, outcomes)
        if reason:
            dropped[reason] += 1
        else:
            kept.append(r)
    if not kept:
        return RLGroup(group_id, [], 0, None, None, dropped, session_ids)
    rewards = [float(r.reward) for r in kept]
    mean = sum(rewards) / len(rewards)
    std = math.sqrt(sum((x - mean) ** 2 for x in rewards) / len(rewards))
    rows = []
    for r in sorted(kept, key=lambda r: r.sample):
        centred = r.reward - mean
        advantage = centred / (std + eps) if scale_by_std else centred
        for t in r.trajectories:
            if not t.trainable_tokens:
                continue
            rows.append({
                "group_id": group_id,
                "group_size": len(kept),
                "sample": r.sample,
                "session_id": r.session_id,
                "trajectory_id": t.id,
                "harness": harness_of(r.session_id) if harness_of else None,
                "input_ids": list(t.token_ids),
                "loss_mask": list(t.loss_mask),
                "logprobs": list(t.logprobs),
                "has_logprobs": t.has_logprobs,
                "reward": float(r.reward),
                "advantage": advantage,
                "group_reward_mean": mean,
                "group_reward_std": std,
                "policy_version": t.policy_version,
                "trainer_policy_version": r.policy_version,
                "num_turns": len(t.turns),
                "truncated": t.truncated,
                "cut": r.cut["reason"] if r.cut else None,
                "verification": None,  # the export fills these from a verification file
                "verify_max_abs_diff": None,
            })
    return RLGroup(group_id, rows, len(kept), mean, std, dropped, session_ids)


def rl_groups(results: Iterable[SessionResult], **options: Any) -> list[RLGroup]:
    """Results grouped by task, groups in order of their first result (options: see `rl_group`)."""
    by_task: dict[str, list[SessionResult]] = {}
    for r in results:
        by_task.setdefault(r.task_id, []).append(r)
    return [rl_group(task_id, rs, **options) for task_id, rs in by_task.items()]


def group_sizes(accepted: list[dict[str, Any]]) -> dict[str, int]:
    """Task id → sessions, from what `RolloutClient.submit` returned."""
    return {a["task_id"]: len(a["sessions"]) for a in accepted}


def stream_rl_groups(client, group_size: int | Mapping[str, int], *, after: int = 0, follow: bool = True,
                     ack: bool = True, include_drained: bool = False, **options: Any) -> Iterator[RLGroup]:
    """Complete groups from a rollout server (`polar.rollout.client.RolloutClient`), as they complete.

    `group_size`: sessions per task (an int for every task, or task id → sessions, e.g.
    `group_sizes(client.submit(tasks))`); results of tasks missing from a mapping are left alone,
    unacknowledged, for another consumer. Every session reports a result, failures included, so a
    group always completes. With `ack`, a group's results are acknowledged once the consumer asks
    for the next group: a trainer that crashes mid-group gets the whole group again. A consumer that
    stops after a group acknowledges it itself: `client.ack(group.seqs)`.
    """
    pending: dict[str, list[tuple[int, SessionResult]]] = {}
    for seq, result in client.results(after=after, follow=follow, ack=False, include_drained=include_drained):
        size = group_size if isinstance(group_size, int) else group_size.get(result.task_id)
        if size is None:
            continue
        bucket = pending.setdefault(result.task_id, [])
        bucket.append((seq, result))
        if len(bucket) >= size:
            del pending[result.task_id]
            group = rl_group(result.task_id, [r for _, r in bucket], **options)
            group.seqs = [s for s, _ in bucket]
            yield group
            if ack:
                client.ack(group.seqs)
