"""A verification results file — the JSON lines `polar verify --json` prints — as report and export read it.

Why a file: verifying needs torch and the weights (often another machine, a GPU node), while the capture DB
is written only by the gateway's writer and the rollout state only by the rollout service; readers open both
read-only. A file of the lines `polar verify --json` already prints travels with the run and is joined on
the trajectory id. Each line carries the digest of what it verified (tokens, mask, captured logprobs), so a
line about another capture of the same id — an older DB, a rebuilt run — is *stale*, never taken for it.

A trajectory's state against a file: verified (ok), failed (out of tolerance, or no logprobs to check),
stale (lines for its id, none for its tokens), not verified (no line for it).
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from polar.trajectories.model import Trajectory
from polar.verify.compare import digest
from polar.verify.errors import VerifyError

State = Literal["verified", "failed", "stale", "not verified"]
STATES: tuple[State, ...] = ("verified", "failed", "stale", "not verified")
_REQUIRED = {"trajectory": str, "session": str, "tokens": int, "ok": bool, "digest": str}


@dataclass(frozen=True)
class Record:
    """One line of a results file (the fields report and export use; `raw` keeps the whole line)."""

    trajectory: str
    session: str
    tokens: int
    ok: bool
    digest: str
    status: str
    max_abs_diff: float | None
    mean_abs_diff: float | None
    missing: int
    spikes: int
    tolerance: float | None
    raw: dict[str, Any]

    @classmethod
    def of(cls, line: dict[str, Any]) -> Record:
        return cls(line["trajectory"], line["session"], line["tokens"], line["ok"], line["digest"],
                   str(line.get("status") or ("ok" if line["ok"] else "mismatch")), line.get("max_abs_diff"),
                   line.get("mean_abs_diff"), int(line.get("missing") or 0), int(line.get("spikes") or 0),
                   line.get("tolerance"), line)


class Verification:
    """The records of one or more results files, looked up by trajectory (id and digest)."""

    def __init__(self, records: list[Record], source: str = ""):
        self.source = source
        self._by_id: dict[str, dict[str, Record]] = {}
        for r in records:  # a later line about the same tokens wins (a re-run appended to the file)
            self._by_id.setdefault(r.trajectory, {})[r.digest] = r

    @classmethod
    def load(cls, *paths: str | Path) -> Verification:
        records = []
        for path in paths:
            records += read_records(path)
        return cls(records, ", ".join(map(str, paths)))

    def __len__(self) -> int:
        return sum(len(v) for v in self._by_id.values())

    def lookup(self, t: Trajectory) -> tuple[State, Record | None]:
        found = self._by_id.get(t.id)
        if not found:
            return "not verified", None
        record = found.get(digest(t))
        if record is None:
            return "stale", None
        return ("verified" if record.ok else "failed"), record

    def summary(self, trajectories: list[Trajectory]) -> dict[str, Any]:
        """How the given trajectories stand against the file, with the worst |Δ| among the matched ones."""
        states: Counter = Counter()
        worst = None
        for t in trajectories:
            state, record = self.lookup(t)
            states[state] += 1
            if record is not None and record.max_abs_diff is not None:
                worst = record.max_abs_diff if worst is None else max(worst, record.max_abs_diff)
        tolerances = sorted({r.tolerance for v in self._by_id.values() for r in v.values() if r.tolerance is not None})
        return {"file": self.source, "records": len(self), "trajectories": len(trajectories),
                **{s.replace(" ", "_"): states[s] for s in STATES}, "max_abs_diff": worst, "tolerances": tolerances}


def read_records(path: str | Path) -> list[Record]:
    """Every trajectory line of a results file; a line that is not one is a clear error naming it."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise VerifyError(f"cannot read the verification results {path}: {exc}") from None
    records = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except ValueError:
            raise VerifyError(f"{path}:{number} is not JSON (expected the lines of `polar verify --json`)") from None
        bad = [k for k, kind in _REQUIRED.items() if not isinstance(item, dict) or not isinstance(item.get(k), kind)
               or (kind is int and isinstance(item.get(k), bool))]
        if bad:
            raise VerifyError(f"{path}:{number} is not a `polar verify --json` line (bad or missing: {', '.join(bad)})")
        records.append(Record.of(item))
    return records
