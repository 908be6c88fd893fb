"""Which trajectories go into a dataset, and into which split.

Selection works on trajectories (a session can hold several: sub-agents, forks, a conversation
the harness re-rendered) but judges the session they came from too: its outcome and reward.
Every rejection is counted under its reason, so the statistics say why a run exported what it did.

The split is deterministic and keyed: each *group* (by default a task, so no task appears in both
splits) gets a stable hash of (seed, key); groups whose hash falls below the validation fraction
go to validation. A group's split therefore never changes as more tasks are exported later. On a
small export where that leaves one split empty, the group nearest the threshold moves over, so
both splits exist whenever there are at least two groups.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import pyarrow as pa

from polar.rollout.tasks import SessionResult
from polar.trajectories.model import Trajectory

SplitBy = Literal["task", "session", "trajectory"]
SPLITS = ("train", "validation")


@dataclass
class Candidate:
    """A trajectory with the session result and harness it came from."""

    trajectory: Trajectory
    result: SessionResult
    harness: str | None = None
    # Against a verification results file (polar.verify.results): verified | failed | stale | not verified.
    verification: str | None = None  # None: no file given
    verify_max_abs_diff: float | None = None

    @property
    def task(self) -> str:
        return self.trajectory.task or self.result.task_id

    @property
    def reward(self) -> float | None:
        return self.trajectory.reward if self.trajectory.reward is not None else self.result.reward

    def identity(self) -> dict[str, Any]:
        """The columns every exported row starts with (IDENTITY_COLUMNS): which trajectory, from where."""
        return {"trajectory_id": self.trajectory.id, "session_id": self.result.session_id, "task": self.task,
                "harness": self.harness, "sample": self.result.sample, "reward": self.reward,
                "cut": self.result.cut["reason"] if self.result.cut else None}


# The Arrow types of `Candidate.identity()`, shared by the chat and token row schemas.
IDENTITY_COLUMNS = [
    ("trajectory_id", pa.string()),
    ("session_id", pa.string()),
    ("task", pa.string()),
    ("harness", pa.string()),
    ("sample", pa.int32()),
    ("reward", pa.float64()),
    ("cut", pa.string()),  # the watchdog ended the session: looping | stalled | budget (null: it was not cut)
]
# What `polar verify` said of a row's trajectory (export --verification FILE; null without a file).
VERIFY_COLUMNS = [
    ("verification", pa.string()),  # verified | failed | stale | not verified
    ("verify_max_abs_diff", pa.float64()),  # its largest |Δ logprob| (null: not compared)
]


@dataclass(frozen=True)
class Selection:
    """What counts as an accepted trajectory (defaults: finished sessions, complete turns, no copies)."""

    min_reward: float | None = None  # set: the reward must be present and at least this
    outcomes: frozenset[str] = frozenset({"ok"})  # session outcomes kept
    include_partial: bool = False  # sessions cut (deadline, watchdog), conversations that went on in failed calls
    include_truncated: bool = False  # trajectories with a turn cut at the token limit
    include_broken_prefix: bool = True  # self-consistent, but re-rendered rather than continued
    dedup: bool = True  # identical token sequences (and masks) are kept once
    require_verified: bool = False  # only trajectories a verification file says are within tolerance


@dataclass
class Selected:
    accepted: list[Candidate]
    rejected: Counter = field(default_factory=Counter)  # reason → trajectories
    attempted: int = 0  # trajectories looked at
    sessions: int = 0  # sessions looked at


def rejection(c: Candidate, rules: Selection) -> str | None:
    """Why this trajectory is left out, or None when it is accepted (duplicates are judged later)."""
    t, r = c.trajectory, c.result
    if r.outcome not in rules.outcomes:
        return f"session {r.outcome}"
    if (r.partial or t.partial) and not rules.include_partial:
        return "partial"
    if t.truncated and not rules.include_truncated:
        return "truncated"
    if t.broken_prefix and not rules.include_broken_prefix:
        return "broken prefix"
    if not t.trainable_tokens:
        return "no trainable tokens"
    if rules.require_verified and c.verification != "verified":
        return {"failed": "failed verification", "stale": "stale verification"}.get(c.verification, "not verified")
    if rules.min_reward is not None:
        if c.reward is None:
            return "no reward"
        if c.reward < rules.min_reward:
            return "reward below threshold"
    return None


def content_key(t: Trajectory) -> bytes:
    """What makes two trajectories the same sample: their tokens and which of them are trained."""
    h = hashlib.blake2b(digest_size=16)
    h.update(np.asarray(t.token_ids, dtype="<u4").tobytes())
    h.update(np.asarray(t.loss_mask, dtype="u1").tobytes())
    return h.digest()


def select(candidates: Iterable[Candidate], rules: Selection = Selection()) -> Selected:
    out = Selected(accepted=[])
    seen: set[bytes] = set()
    sessions: set[str] = set()
    for c in candidates:
        out.attempted += 1
        sessions.add(c.result.session_id)
        reason = rejection(c, rules)
        if reason is None and rules.dedup:
            key = content_key(c.trajectory)
            if key in seen:
                reason = "duplicate"
            seen.add(key)
        if reason is None:
            out.accepted.append(c)
        else:
            out.rejected[reason] += 1
    out.sessions = len(sessions)
    return out


def group_key(c: Candidate, by: SplitBy) -> str:
    if by == "task":
        return c.task
    if by == "session":
        return c.result.session_id
    return c.trajectory.id


def _unit(seed: int, key: str) -> float:
    """A stable number in [0, 1) for (seed, key)."""
    digest = hashlib.blake2b(f"{seed}\0{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


def assign_splits(keys: Iterable[str], val_fraction: float, seed: int = 0) -> dict[str, str]:
    """Group key → "train" | "validation" (see the module docstring)."""
    if not 0.0 <= val_fraction < 1.0:
        raise ValueError(f"the validation fraction must be in [0, 1), got {val_fraction}")
    units = {k: _unit(seed, k) for k in set(keys)}
    splits = {k: "validation" if u < val_fraction else "train" for k, u in units.items()}
    if val_fraction > 0 and len(units) >= 2:
        ranked = sorted(units, key=lambda k: (units[k], k))
        if "validation" not in splits.values():
            splits[ranked[0]] = "validation"
        if "train" not in splits.values():
            splits[ranked[-1]] = "train"
    return splits


def split(accepted: list[Candidate], val_fraction: float, seed: int = 0,
          by: SplitBy = "task") -> dict[str, list[Candidate]]:
    """Accepted trajectories per split, each in its original order."""
    splits = assign_splits((group_key(c, by) for c in accepted), val_fraction, seed)
    out: dict[str, list[Candidate]] = {name: [] for name in SPLITS}
    for c in accepted:
        out[splits[group_key(c, by)]].append(c)
    return out
