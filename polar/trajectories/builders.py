"""Captured calls → trajectories: `per_request` (one sample per call) and `prefix_merge`.

prefix_merge, per session, in capture order. A call's *sequence* is its prompt + its sampled ids.
- The call whose sequence is the longest prefix of the new prompt is where the new call belongs:
  if it is the last call of its trajectory the new call joins it (the tokens in between are
  masked context); if it is an earlier call, the conversation branched there and the new call
  starts a fork that records its parent and fork position.
- A call that extends no sequence starts a new root.
- A new trajectory (root or fork) that *meant* to continue an earlier call whose sequence its
  prompt does not repeat marks a broken prefix (the harness or the template re-rendered history
  differently) and records where, against which call. Intent comes from the canonical requests:
  the new request repeats the earlier one's conversation and adds an assistant turn, or names it
  through `previous_response_id`. Rows without a canonical request fall back, for roots only, to
  a long shared token prefix. Separate conversations in one session (sub-agents, title
  generators) open differently and become separate roots without any break.
- Calls that produced no sample (errors, interrupted or pending calls) are never trajectories; one
  that continued a trajectory's last call with nothing after it marks that trajectory `partial`.

Finding the parent costs one common-prefix scan per open trajectory (the calls of a trajectory have
nested sequences, so one scan against its tip covers all of them), and each scan stops at the first
mismatch: O(calls × lineages) scans, each proportional to the shared prefix.
"""

from __future__ import annotations

import bisect
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from polar.capture.tokens import common_prefix_len
from polar.trajectories.model import Lineage, PrefixBreak, Trajectory, Turn

MIN_SHARED_TOKENS = 32  # token-only evidence of a continuation (rows without a canonical request)


def is_sample(row: dict[str, Any]) -> bool:
    """An ok call whose tokens were captured (count-tokens calls are ok but sample nothing)."""
    return row.get("status") == "ok" and row.get("prompt_len") is not None


def is_failed(row: dict[str, Any]) -> bool:
    """A call that produced no answer: error, interrupted, or still pending."""
    return row.get("status") != "ok"


def by_session(rows: Iterable[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Rows grouped by session, sessions in order of first appearance, rows oldest first."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for row in sorted(rows, key=lambda r: r["id"]):
        groups.setdefault(row["session_id"], []).append(row)
    return groups


@dataclass
class _Sample:
    row: dict[str, Any]
    prompt: np.ndarray
    completion: np.ndarray
    seq: np.ndarray  # prompt + completion

    @classmethod
    def of(cls, row: dict[str, Any]) -> _Sample:
        prompt = np.asarray(row.get("prompt_ids") or [], dtype=np.int64)
        completion = np.asarray(row.get("completion_ids") or [], dtype=np.int64)
        return cls(row, prompt, completion, np.concatenate([prompt, completion]))

    @property
    def id(self) -> int:
        return self.row["id"]

    @property
    def has_logprobs(self) -> bool:
        # None (not captured) or a partial list: the whole span counts as missing, never padded.
        values = self.row.get("completion_logprobs")
        return len(values or []) == len(self.completion)

    def logprobs(self) -> list[float | None]:
        if self.has_logprobs:
            return list(self.row.get("completion_logprobs") or [])
        return [None] * len(self.completion)


def _turn(sample: _Sample, prompt_start: int) -> Turn:
    row = sample.row
    return Turn(
        row_id=row["id"],
        call_id=row["call_id"],
        prompt_start=prompt_start,
        completion_start=len(sample.prompt),
        completion_end=len(sample.seq),
        finish_reason=row.get("finish_reason"),
        prompt_mode=row.get("prompt_mode"),
        policy_version=row.get("policy_version"),
        has_logprobs=sample.has_logprobs,
    )


@dataclass
class _Open:
    """A trajectory being built: its calls' samples, in order, all nested prefixes of the tip."""

    id: str
    session_id: str
    samples: list[_Sample]
    start: int = 0  # tokens before this are inherited from the parent (forks)
    lineage: Lineage | None = None
    prefix_break: PrefixBreak | None = None
    failed_row_ids: list[int] = field(default_factory=list)
    ends: list[int] = field(default_factory=list)  # sequence length after each call

    def __post_init__(self) -> None:
        self.ends = [len(s.seq) for s in self.samples]

    @property
    def tip(self) -> np.ndarray:
        return self.samples[-1].seq

    def add(self, sample: _Sample) -> None:
        self.samples.append(sample)
        self.ends.append(len(sample.seq))

    def deepest_prefix_of(self, prompt: np.ndarray) -> int | None:
        """Index of the latest call whose sequence is a prefix of `prompt`, if any."""
        shared = common_prefix_len(prompt, self.tip)
        index = bisect.bisect_right(self.ends, shared) - 1
        return index if index >= 0 else None

    def finish(self, builder: str) -> Trajectory:
        chunks, mask, turns = [], [], []
        logprobs: list[float | None] = []
        pos = 0
        first = self.samples[0]
        if self.start:  # the inherited prefix: context here, trained in the parent
            chunks.append(first.prompt[: self.start])
            pos = self.start
        for sample in self.samples:
            context = sample.prompt[pos:]
            values = sample.logprobs()
            chunks += [context, sample.completion]
            turns.append(_turn(sample, pos))
            logprobs += [0.0] * len(context) + values
            mask += [0] * len(context) + [1] * len(sample.completion)
            pos = len(sample.seq)
        mask = [0] * self.start + mask
        logprobs = [0.0] * self.start + logprobs
        versions = {t.policy_version for t in turns}
        return Trajectory(
            id=self.id,
            builder=builder,
            session_id=self.session_id,
            metadata={"provider": first.row.get("provider"), "model": first.row.get("model")},
            lineage=self.lineage,
            token_ids=np.concatenate(chunks).tolist(),
            loss_mask=mask,
            logprobs=logprobs,
            turns=turns,
            policy_version=versions.pop() if len(versions) == 1 else None,
            truncated=any(t.truncated for t in turns),
            broken_prefix=self.prefix_break is not None,
            prefix_break=self.prefix_break,
            partial=bool(self.failed_row_ids),
            failed_row_ids=self.failed_row_ids,
        )


def _trajectory_id(session_id: str, row_id: int) -> str:
    return f"{session_id}#{row_id}"


# -- continuation intent from the canonical requests ------------------------------------------------


@dataclass(frozen=True)
class _Conversation:
    """What a request's conversation looks like, enough to tell whether one continues another."""

    opening: str  # the first non-system message, serialised: differs between separate conversations
    roles: tuple[str, ...]  # roles of the non-system messages
    previous_call: str | None  # Responses `previous_response_id`, as a capture call id

    @classmethod
    def of(cls, row: dict[str, Any]) -> _Conversation | None:
        canonical = row.get("canonical")
        if not isinstance(canonical, dict) or not isinstance(canonical.get("messages"), list):
            return None
        messages = [m for m in canonical["messages"] if isinstance(m, dict) and m.get("role") != "system"]
        metadata = canonical.get("metadata")  # captures made before `continues` kept it in metadata
        previous = canonical.get("continues") or (
            metadata.get("previous_response_id") if isinstance(metadata, dict) else None
        )
        opening = json.dumps(messages[0], sort_keys=True, ensure_ascii=False) if messages else ""
        return cls(opening, tuple(str(m.get("role")) for m in messages),
                   previous.removeprefix("resp_") if isinstance(previous, str) else None)

    def continues(self, earlier: _Conversation) -> bool:
        """This request repeats `earlier`'s conversation and adds (at least) the answer to it."""
        k = len(earlier.roles)
        return (
            bool(self.opening)
            and self.opening == earlier.opening
            and len(self.roles) > k
            and self.roles[:k] == earlier.roles
            and self.roles[k] == "assistant"
        )


class _Intent:
    """Index of earlier samples by how their conversation opens, to find what a call continues."""

    def __init__(self) -> None:
        self._by_opening: dict[str, list[tuple[_Conversation, _Sample]]] = {}
        self._by_call: dict[str, _Sample] = {}

    def add(self, sample: _Sample) -> None:
        self._by_call[sample.row["call_id"]] = sample
        conv = _Conversation.of(sample.row)
        if conv is not None:
            self._by_opening.setdefault(conv.opening, []).append((conv, sample))

    def predecessor(self, row: dict[str, Any]) -> tuple[_Sample, str] | None:
        """The earlier sample `row` meant to continue (the longest conversation it repeats)."""
        conv = _Conversation.of(row)
        if conv is None:
            return None
        if conv.previous_call and (prior := self._by_call.get(conv.previous_call)) and prior.id < row["id"]:
            return prior, "previous_response_id"
        best: _Sample | None = None
        best_len = -1
        for earlier, sample in self._by_opening.get(conv.opening, ()):
            if sample.id < row["id"] and conv.continues(earlier) and len(earlier.roles) >= best_len:
                best, best_len = sample, len(earlier.roles)
        return (best, "conversation") if best is not None else None


# -- the builders ---------------------------------------------------------------------------------


def per_request(rows: Iterable[dict[str, Any]]) -> list[Trajectory]:
    """One trajectory per sampled call: its prompt masked, its completion trainable."""
    out = []
    for session_id, group in by_session(rows).items():
        for row in filter(is_sample, group):
            single = _Open(_trajectory_id(session_id, row["id"]), session_id, [_Sample.of(row)])
            out.append(single.finish("per-request"))
    return out


def prefix_merge(rows: Iterable[dict[str, Any]], min_shared: int = MIN_SHARED_TOKENS) -> list[Trajectory]:
    """Join calls that extend an earlier call's prompt + sample into one trajectory per lineage."""
    out = []
    for session_id, group in by_session(rows).items():
        out += [t.finish("prefix-merge") for t in _merge_session(session_id, group, min_shared)]
    return out


BUILDERS: dict[str, Callable[[Iterable[dict[str, Any]]], list[Trajectory]]] = {
    "per-request": per_request,
    "prefix-merge": prefix_merge,
}


def _merge_session(session_id: str, rows: list[dict[str, Any]], min_shared: int) -> list[_Open]:
    trajectories: list[_Open] = []
    owner: dict[int, _Open] = {}  # row id → its trajectory
    continued: set[int] = set()  # samples some later sample continued (or tried to)
    intent = _Intent()
    for row in filter(is_sample, rows):
        sample = _Sample.of(row)
        parent, index = _deepest(sample.prompt, trajectories)
        if parent is not None and index == len(parent.samples) - 1:
            continued.add(parent.samples[index].id)
            parent.add(sample)
            target = parent
        else:
            target = _Open(_trajectory_id(session_id, row["id"]), session_id, [sample])
            if parent is not None:
                base = parent.samples[index]
                target.start = parent.ends[index]
                target.lineage = Lineage(parent_id=parent.id, parent_row_id=base.id, fork_position=parent.ends[index])
                continued.add(base.id)
            target.prefix_break = _find_break(sample, parent is None, intent, owner, trajectories, min_shared)
            if target.prefix_break is not None:
                continued.add(target.prefix_break.earlier_row_id)
            trajectories.append(target)
        owner[row["id"]] = target
        intent.add(sample)
    _mark_partial(rows, intent, owner, continued)
    return trajectories


def _deepest(prompt: np.ndarray, trajectories: list[_Open]) -> tuple[_Open | None, int]:
    """The trajectory and call index of the longest call sequence that prefixes `prompt`.

    Ties (identical sequences) go to a trajectory's last call, then to the most recent one.
    """
    best: tuple[int, bool, int] | None = None
    found: tuple[_Open | None, int] = (None, -1)
    for traj in trajectories:
        index = traj.deepest_prefix_of(prompt)
        if index is None:
            continue
        key = (traj.ends[index], index == len(traj.samples) - 1, traj.samples[index].id)
        if best is None or key > best:
            best, found = key, (traj, index)
    return found


def _find_break(
    sample: _Sample, root: bool, intent: _Intent, owner: dict[int, _Open], trajectories: list[_Open], min_shared: int
) -> PrefixBreak | None:
    """If this call meant to continue an earlier call whose sequence its prompt does not repeat, where it left it.

    A fork can break too: re-rendering only the last sample keeps the prompt on the call before
    it, so the prompt extends that call (the fork point) and breaks against the one it continued.
    """
    found = intent.predecessor(sample.row)
    if found is not None:
        earlier, evidence = found
        shared = common_prefix_len(sample.prompt, earlier.seq)
        if shared == len(earlier.seq):  # it extends what it continued: a clean fork
            return None
    elif root and _Conversation.of(sample.row) is None and trajectories:
        # No canonical request to read intent from: trust only a long shared prefix with a tip.
        shared, tip = max(((common_prefix_len(sample.prompt, t.tip), t) for t in reversed(trajectories)),
                          key=lambda pair: pair[0])  # ties: the most recent lineage
        if shared < min_shared:
            return None
        earlier, evidence = tip.samples[-1], "tokens"
    else:
        return None
    return PrefixBreak(
        earlier_row_id=earlier.id,
        earlier_trajectory_id=owner[earlier.id].id,
        position=shared,
        expected_id=int(earlier.seq[shared]),
        actual_id=int(sample.prompt[shared]) if shared < len(sample.prompt) else None,
        evidence=evidence,
    )


def _mark_partial(rows: list[dict[str, Any]], intent: _Intent, owner: dict[int, _Open], continued: set[int]) -> None:
    """A failed call that continued a trajectory's end, with nothing after it, leaves it partial."""
    for row in filter(is_failed, rows):
        found = intent.predecessor(row)
        if found is None:
            continue
        earlier = found[0]
        traj = owner[earlier.id]
        if earlier.id not in continued and traj.samples[-1] is earlier:
            traj.failed_row_ids.append(row["id"])


def summary(rows: list[dict[str, Any]], trajectories: list[Trajectory]) -> dict[str, int]:
    """Counts for a build: nothing captured goes unaccounted (failed calls are counted, not hidden)."""
    return {
        "sessions": len({r["session_id"] for r in rows}),
        "calls": len(rows),
        "samples": sum(map(is_sample, rows)),
        "failed": sum(map(is_failed, rows)),
        "trajectories": len(trajectories),
        "trainable_tokens": sum(t.trainable_tokens for t in trajectories),
        "turns_without_logprobs": sum(t.turns_without_logprobs for t in trajectories),
    }
