"""Verification results files with chosen verdicts, for the report and export tests (no worker needed)."""

from __future__ import annotations

import json
from pathlib import Path

from polar.trajectories.model import Trajectory
from polar.verify.compare import checked_positions, compare


def results_file(path: Path, trajectories: list[Trajectory], fail: set[str] = frozenset(),
                 stale: set[str] = frozenset(), skip: set[str] = frozenset()) -> Path:
    """The lines `polar verify --json` would print: `fail` ids get one spike (Δ = 10 on the first sampled token),
    `stale` ids a digest of other tokens, `skip` ids no line; the rest match within 0.001."""
    lines = []
    for t in trajectories:
        if t.id in skip:
            continue
        positions, missing = checked_positions(t)
        recomputed = [t.logprobs[p] + (10.0 if t.id in fail and i == 0 else 0.001) for i, p in enumerate(positions)]
        line = compare(t, positions, recomputed, missing).to_json()
        if t.id in stale:
            line["digest"] = "0" * 32
        lines.append(json.dumps(line))
    path.write_text("".join(line + "\n" for line in lines))
    return path
