"""A verification run: trajectories rebuilt from a capture DB, recomputed by the worker, judged one by one.

    run = verify("captures.db", "/models/served", python="/venvs/torch/bin/python")
    run.ok                      # every trajectory within tolerance
    for check in run.checks: check.to_json()

`iter_checks` yields the checks as they come (the CLI prints each at once). The capture DB is opened
read-only; nothing is written anywhere (the CLI's --json lines are the results file report/export read).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from polar.capture.reader import CaptureReader
from polar.sqlite_files import WrongDatabase
from polar.trajectories.builders import BUILDERS
from polar.trajectories.model import Trajectory
from polar.verify.compare import Tolerance, TrajectoryCheck, checked_positions, compare
from polar.verify.errors import VerifyError
from polar.verify.runner import Worker


def load_trajectories(db: str | Path, builder: str = "prefix-merge", session: str | None = None) -> list[Trajectory]:
    """The trajectories of a capture DB (or one session of it), as `polar trajectories` builds them."""
    if builder not in BUILDERS:
        raise VerifyError(f"unknown builder {builder!r} (use {', '.join(BUILDERS)})")
    try:
        rows = list(CaptureReader(db).calls(session=session))
    except WrongDatabase as exc:
        raise VerifyError(str(exc)) from None
    built = BUILDERS[builder](rows)
    if not built:
        where = f"session {session!r} of {db}" if session else str(db)
        sampled = sum(r.get("status") == "ok" and r.get("prompt_len") is not None for r in rows)
        raise VerifyError(f"no trajectory to verify in {where}: {len(rows)} captured calls, {sampled} with tokens")
    return built


def _recompute(worker: Worker, t: Trajectory) -> tuple[list[int], list[float | None], int]:
    positions, missing = checked_positions(t)
    if not positions:
        return positions, [], missing
    top = max(t.token_ids)
    if top >= worker.vocab_size:
        raise VerifyError(f"trajectory {t.id} holds token id {top}, outside the vocabulary of {worker.model} "
                          f"({worker.vocab_size} ids): that is not the model these captures were sampled from")
    return positions, worker.logprobs(t.token_ids, positions), missing


def iter_checks(trajectories: Iterable[Trajectory], worker: Worker,
                tolerance: Tolerance = Tolerance()) -> Iterator[TrajectoryCheck]:
    """One check per trajectory, in order."""
    for t in trajectories:
        positions, recomputed, missing = _recompute(worker, t)
        yield compare(t, positions, recomputed, missing, tolerance)


@dataclass
class VerifyRun:
    checks: list[TrajectoryCheck]
    worker: dict[str, Any]  # what recomputed: dtype, device, torch and transformers versions, python
    tolerance: Tolerance

    @property
    def ok(self) -> bool:
        return bool(self.checks) and all(c.ok for c in self.checks)

    def summary(self) -> dict[str, Any]:
        return summarize(self.checks, self.tolerance, self.worker)


def summarize(checks: list[TrajectoryCheck], tolerance: Tolerance, worker: dict[str, Any] | None = None) -> dict:
    """Counts and the |Δ| distribution over every compared token: what the tolerance is judged against."""
    abs_diffs = np.concatenate([c.abs_diffs for c in checks]) if checks else np.zeros(0)
    quantiles = {f"p{q:g}": float(np.quantile(abs_diffs, q / 100)) for q in (50, 90, 99, 99.9)} if len(abs_diffs) \
        else {}
    return {
        "trajectories": len(checks), "ok": sum(c.ok for c in checks),
        "mismatch": sum(c.status == "mismatch" for c in checks),
        "no_logprobs": sum(c.status == "no-logprobs" for c in checks),
        "tokens": sum(c.tokens for c in checks), "missing": sum(c.missing for c in checks),
        "spikes": sum(c.spikes for c in checks), "nonfinite": sum(c.nonfinite for c in checks),
        "abs_diff": {"mean": float(abs_diffs.mean()) if len(abs_diffs) else None, **quantiles,
                     "max": float(abs_diffs.max()) if len(abs_diffs) else None},
        "tolerance": tolerance.max_abs_diff, "ratio_threshold": tolerance.ratio_threshold,
        "worker": {k: v for k, v in (worker or {}).items() if k != "ready"},
    }  # fmt: skip


def verify(db: str | Path, model: str | Path, *, python: str | None = None, dtype: str = "float32",
           device: str = "auto", tolerance: Tolerance = Tolerance(), builder: str = "prefix-merge",
           session: str | None = None, chunk: int = 1024,
           on_check: Callable[[TrajectoryCheck], None] | None = None) -> VerifyRun:
    """Verify every trajectory of a capture DB against the model at `model` (see the module docstring).
    `on_check` sees each check as it is made. Raises VerifyError when the run cannot go ahead."""
    trajectories = load_trajectories(db, builder, session)
    checks = []
    with Worker(model, python=python, dtype=dtype, device=device, chunk=chunk) as worker:
        for check in iter_checks(trajectories, worker, tolerance):
            checks.append(check)
            if on_check is not None:
                on_check(check)
        info = dict(worker.info, model=str(worker.model), python=worker.python)
    return VerifyRun(checks, info, tolerance)
