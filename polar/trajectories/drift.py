"""The drift report: per session, do sampled tokens come back unchanged, and where did a prefix break?

Built on the prefix-merge trajectories. A call is *carried* when a later call continued it (joined
its trajectory, forked from it, or meant to continue it and broke the prefix). Its sampled tokens
*reappear* when the continuing prompt repeats them at the same positions: all of them for a join or
a fork, those before the break position otherwise. In token-faithful mode the fraction is 1.0.

Each break names the continuing call, the call it left, the first differing position, which span
of the earlier sequence that position falls in (sampled tokens, or context the trajectory added
before a call), the prompt mode of the breaking call, and a few ids on each side, decoded when a
tokenizer (anything with `decode(ids) -> str`) is given.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any, Protocol

from pydantic import BaseModel, Field
from rich.console import Console
from rich.table import Table

from polar.trajectories.builders import by_session, is_sample, prefix_merge
from polar.trajectories.model import Trajectory, Turn


class Decoder(Protocol):
    def decode(self, ids: list[int]) -> str: ...


class BreakReport(BaseModel):
    row_id: int
    call_id: str
    earlier_row_id: int
    earlier_call_id: str
    evidence: str  # how the continuation was recognised (see PrefixBreak)
    prompt_mode: str | None  # of the breaking call: how its prompt was built
    position: int  # first index where the prompt leaves the earlier sequence
    region: str  # "sampled" | "context" | "end-of-prompt"
    region_row_id: int | None  # the call whose sampled tokens / preceding context hold `position`
    expected_ids: list[int]  # the earlier sequence from `position` (a short window)
    actual_ids: list[int]  # the new prompt from `position`
    before_text: str | None = None  # decoded window before `position` (shared by both)
    expected_text: str | None = None
    actual_text: str | None = None


class SessionDrift(BaseModel):
    session_id: str
    calls: int
    samples: int
    not_ok: dict[str, int] = Field(default_factory=dict)  # status → calls that produced no sample
    trajectories: int
    sampled_tokens: int
    carried_tokens: int  # sampled tokens of calls a later call continued
    reappeared_tokens: int  # of those, how many the continuing prompt repeated unchanged
    breaks: list[BreakReport] = Field(default_factory=list)

    @property
    def reappeared_fraction(self) -> float:
        return self.reappeared_tokens / self.carried_tokens if self.carried_tokens else 1.0

    def to_json(self) -> dict[str, Any]:
        return {**self.model_dump(), "reappeared_fraction": self.reappeared_fraction}


def drift_report(
    rows: Iterable[dict[str, Any]],
    tokenizer: Decoder | None = None,
    window: int = 12,
    trajectories: list[Trajectory] | None = None,
) -> list[SessionDrift]:
    """One report per session of `rows`, on their prefix-merge trajectories (built unless given)."""
    groups = by_session(rows)
    if trajectories is None:
        trajectories = prefix_merge(r for group in groups.values() for r in group)
    elif any(t.builder != "prefix-merge" for t in trajectories):
        raise ValueError("the drift report reads prefix-merge trajectories")
    per_session: dict[str, list[Trajectory]] = {}
    for traj in trajectories:
        per_session.setdefault(traj.session_id, []).append(traj)
    return [
        session_drift(session, group, per_session.get(session, []), tokenizer, window)
        for session, group in groups.items()
    ]


def session_drift(
    session_id: str,
    rows: list[dict[str, Any]],
    trajectories: list[Trajectory],
    tokenizer: Decoder | None = None,
    window: int = 12,
) -> SessionDrift:
    by_id = {t.id: t for t in trajectories}
    where = {turn.row_id: (traj, turn) for traj in trajectories for turn in traj.turns}
    reappeared: dict[int, int] = {}  # carried row id → most of its sampled tokens any successor kept

    def carry(row_id: int, kept: int) -> None:
        reappeared[row_id] = max(reappeared.get(row_id, 0), kept)

    breaks = []
    for traj in trajectories:
        for prev, turn in zip(traj.turns, traj.turns[1:]):
            carry(prev.row_id, _sampled(prev))
        if traj.lineage is not None:
            carry(traj.lineage.parent_row_id, _sampled(where[traj.lineage.parent_row_id][1]))
        if traj.prefix_break is not None:
            pb = traj.prefix_break
            earlier = where[pb.earlier_row_id][1]
            carry(pb.earlier_row_id, max(0, min(pb.position, earlier.completion_end) - earlier.completion_start))
            breaks.append(_break_report(traj, where, by_id, tokenizer, window))
    samples = [r for r in rows if is_sample(r)]
    not_ok = Counter(r["status"] for r in rows if r.get("status") != "ok")
    return SessionDrift(
        session_id=session_id,
        calls=len(rows),
        samples=len(samples),
        not_ok=dict(not_ok),
        trajectories=len(trajectories),
        sampled_tokens=sum(len(r.get("completion_ids") or []) for r in samples),
        carried_tokens=sum(_sampled(where[row_id][1]) for row_id in reappeared),
        reappeared_tokens=sum(reappeared.values()),
        breaks=breaks,
    )


def _sampled(turn: Turn) -> int:
    return turn.completion_end - turn.completion_start


def _break_report(
    traj: Trajectory,
    where: dict[int, tuple[Trajectory, Turn]],
    by_id: dict[str, Trajectory],
    tokenizer: Decoder | None,
    window: int,
) -> BreakReport:
    pb = traj.prefix_break
    assert pb is not None
    first = traj.turns[0]
    earlier_traj, earlier = where[pb.earlier_row_id]
    expected_seq = earlier_traj.token_ids[: earlier.completion_end]
    prompt = traj.token_ids[: first.completion_start]
    pos = pb.position
    region, region_row = _region(earlier_traj, pos, by_id)
    report = BreakReport(
        row_id=first.row_id,
        call_id=first.call_id,
        earlier_row_id=earlier.row_id,
        earlier_call_id=earlier.call_id,
        evidence=pb.evidence,
        prompt_mode=first.prompt_mode,
        position=pos,
        region=region if pos < len(prompt) else "end-of-prompt",
        region_row_id=region_row,
        expected_ids=expected_seq[pos : pos + window],
        actual_ids=prompt[pos : pos + window],
    )
    if tokenizer is not None:
        report.before_text = tokenizer.decode(prompt[max(0, pos - window) : pos])
        report.expected_text = tokenizer.decode(report.expected_ids)
        report.actual_text = tokenizer.decode(report.actual_ids)
    return report


def _region(traj: Trajectory, pos: int, by_id: dict[str, Trajectory]) -> tuple[str, int | None]:
    """Which call's span holds `pos` in `traj`'s sequence (following forks into their parents)."""
    while traj.lineage is not None and pos < traj.lineage.fork_position and traj.lineage.parent_id in by_id:
        traj = by_id[traj.lineage.parent_id]
    for turn in traj.turns:
        if pos < turn.completion_start:
            return "context", turn.row_id
        if pos < turn.completion_end:
            return "sampled", turn.row_id
    return "end-of-prompt", None


# -- terminal view ------------------------------------------------------------------------------------


def print_drift(reports: list[SessionDrift], console: Console | None = None) -> None:
    console = console or Console()
    summary = Table(title="drift per session")
    for col in ("session", "calls", "samples", "not ok", "trajectories", "sampled", "carried", "reappeared", "breaks"):
        summary.add_column(col, justify="left" if col in ("session", "not ok") else "right")
    for r in reports:
        summary.add_row(
            r.session_id, str(r.calls), str(r.samples), ", ".join(f"{k} {v}" for k, v in sorted(r.not_ok.items())),
            str(r.trajectories), str(r.sampled_tokens), str(r.carried_tokens),
            f"{r.reappeared_tokens} ({r.reappeared_fraction:.1%})", str(len(r.breaks)),
        )
    console.print(summary)
    breaks = [(r.session_id, b) for r in reports for b in r.breaks]
    if not breaks:
        return
    table = Table(title="prefix breaks")
    for col in ("session", "row", "left row", "position", "in", "prompt mode", "expected", "actual"):
        table.add_column(col, justify="right" if col in ("row", "left row", "position") else "left")
    for session, b in breaks:
        where = b.region + (f" of row {b.region_row_id}" if b.region_row_id is not None else "")
        table.add_row(
            session, str(b.row_id), str(b.earlier_row_id), str(b.position), where, b.prompt_mode or "",
            _shown(b.expected_ids, b.expected_text), _shown(b.actual_ids, b.actual_text),
        )
    console.print(table)


def _shown(ids: list[int], text: str | None) -> str:
    return repr(text) if text is not None else " ".join(map(str, ids))
