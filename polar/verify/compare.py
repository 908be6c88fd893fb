"""Captured logprobs against recomputed ones, per trajectory: the numbers `polar verify` judges on.

Δ = recomputed − captured, per sampled token: the trainer's logprob minus the sampler's, so exp(Δ) is the
importance ratio π_trainer / π_sampler an off-policy correction would apply. A token is *off* when
|Δ| > `tolerance`: the positions of those are the spikes, and a trajectory is ok when it has checked tokens
and none of them is off. Sampled tokens without a captured logprob (None: the upstream gave none) are
counted as `missing`, never compared: a 0.0 would read as probability 1.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from polar.trajectories.model import Trajectory

# bf16 serving (vLLM) against an fp32 recompute of the same weights; measured in docs/verify.md.
DEFAULT_TOLERANCE = 3.0  # nats; the largest faithful |Δ| measured was 2.16 (a bf16 tie fp32 breaks)
DEFAULT_RATIO_THRESHOLD = 0.2  # |exp(Δ) − 1| above this: the importance ratio leaves a PPO-style clip range
SPIKES_LISTED = 32  # spikes detailed per trajectory (all are counted)


@dataclass(frozen=True)
class Tolerance:
    max_abs_diff: float = DEFAULT_TOLERANCE  # per token: |Δ logprob| above this is a spike
    ratio_threshold: float = DEFAULT_RATIO_THRESHOLD

    def __post_init__(self) -> None:
        if not self.max_abs_diff >= 0 or not self.ratio_threshold >= 0:  # also refuses nan
            raise ValueError(f"tolerances must be ≥ 0 (got {self.max_abs_diff}, {self.ratio_threshold})")


def digest(t: Trajectory) -> str:
    """What a verification is of: the tokens, which are sampled, and the captured logprobs (None as nan).
    A results file whose digest differs from a trajectory's is about another capture of it: stale."""
    h = hashlib.blake2b(digest_size=16)
    h.update(np.asarray(t.token_ids, dtype="<u4").tobytes())
    h.update(np.asarray(t.loss_mask, dtype="u1").tobytes())
    h.update(np.asarray([math.nan if v is None else v for v in t.logprobs], dtype="<f4").tobytes())
    return h.hexdigest()


def checked_positions(t: Trajectory) -> tuple[list[int], int]:
    """The sampled positions that carry a captured logprob, and how many sampled ones do not."""
    positions, missing = [], 0
    for p, (m, lp) in enumerate(zip(t.loss_mask, t.logprobs)):
        if m:
            if lp is None or p == 0:  # p = 0 has no context to recompute it in
                missing += 1
            else:
                positions.append(p)
    return positions, missing


def _turn_of(t: Trajectory, position: int) -> int | None:
    return next((i for i, u in enumerate(t.turns) if u.completion_start <= position < u.completion_end), None)


def _number(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None  # JSON has no inf / nan: null, and the spike says why


@dataclass
class TrajectoryCheck:
    """One trajectory's verdict; `to_json()` is the line `polar verify --json` prints."""

    trajectory: str
    session: str
    tokens: int  # sampled tokens compared
    missing: int  # sampled tokens without a captured logprob (not compared)
    mean_abs_diff: float | None  # over the compared tokens with a finite Δ; None: there are none
    max_abs_diff: float | None
    nonfinite: int  # compared tokens whose Δ is not finite (a logprob of −inf or nan on one side): spikes
    ratio_off: float | None  # share of compared tokens with |exp(Δ) − 1| > ratio_threshold
    spikes: int  # tokens with |Δ| > tolerance, non-finite ones included
    spike_positions: list[int]  # all of them, in order (indices into the trajectory's token_ids)
    spike_details: list[dict[str, Any]]  # the first SPIKES_LISTED, with ids and both logprobs
    ok: bool
    status: str  # ok | mismatch | no-logprobs
    digest: str
    tolerance: Tolerance
    builder: str = "prefix-merge"
    turns: int = 0
    abs_diffs: np.ndarray = field(default_factory=lambda: np.zeros(0), repr=False)  # the finite |Δ|s

    def to_json(self) -> dict[str, Any]:
        return {
            "trajectory": self.trajectory, "session": self.session, "tokens": self.tokens, "missing": self.missing,
            "mean_abs_diff": self.mean_abs_diff, "max_abs_diff": self.max_abs_diff, "nonfinite": self.nonfinite,
            "ratio_off": self.ratio_off, "spikes": self.spikes, "spike_positions": self.spike_positions,
            "spike_details": self.spike_details, "ok": self.ok, "status": self.status,
            "tolerance": self.tolerance.max_abs_diff, "ratio_threshold": self.tolerance.ratio_threshold,
            "builder": self.builder, "turns": self.turns, "digest": self.digest,
        }  # fmt: skip


def compare(t: Trajectory, positions: list[int], recomputed: list[float | None], missing: int,
            tolerance: Tolerance = Tolerance()) -> TrajectoryCheck:
    """The verdict on `t` given the recomputed logprobs at `positions` (from `checked_positions`)."""
    if len(recomputed) != len(positions):
        raise ValueError(f"{len(recomputed)} recomputed logprobs for {len(positions)} positions")
    captured = np.array([t.logprobs[p] for p in positions], dtype=np.float64)
    ours = np.array([math.nan if v is None else v for v in recomputed], dtype=np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        diff = ours - captured
        absdiff = np.abs(diff)
        off = ~(absdiff <= tolerance.max_abs_diff)  # nan (−inf − −inf, a missing recompute) counts as off
        ratio_off = ~(np.abs(np.expm1(diff)) <= tolerance.ratio_threshold)
    finite = absdiff[np.isfinite(absdiff)]
    n = len(positions)
    where = np.flatnonzero(off)
    details = [{"position": positions[i], "turn": _turn_of(t, positions[i]), "token_id": t.token_ids[positions[i]],
                "captured": _number(captured[i]), "recomputed": _number(ours[i]), "diff": _number(diff[i])}
               for i in where[:SPIKES_LISTED]]
    status = "no-logprobs" if n == 0 else "mismatch" if len(where) else "ok"
    return TrajectoryCheck(
        trajectory=t.id, session=t.session_id, tokens=n, missing=missing,
        mean_abs_diff=float(finite.mean()) if len(finite) else None,
        max_abs_diff=float(finite.max()) if len(finite) else None, nonfinite=n - len(finite),
        ratio_off=float(ratio_off.mean()) if n else None, spikes=len(where),
        spike_positions=[positions[i] for i in where], spike_details=details,
        ok=status == "ok", status=status, digest=digest(t), tolerance=tolerance, builder=t.builder,
        turns=len(t.turns), abs_diffs=finite,
    )  # fmt: skip
