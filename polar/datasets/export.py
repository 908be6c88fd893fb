"""The batch export: a rollout run's accepted trajectories as train/validation datasets.

    OUT/chat/{train,validation}.{jsonl,parquet}   messages + tools (needs the capture database)
    OUT/tokens/{train,validation}.{jsonl,parquet} input_ids, labels, loss_mask, logprobs
    OUT/rl/groups.{jsonl,parquet}                 GRPO groups with advantages (with `rl=True`)
    OUT/stats.json                                what was selected and written, and why not the rest

A split with no rows is not written. Files of an earlier export in the same directory are removed
first, so OUT never mixes two runs.
"""

from __future__ import annotations

import json
from collections import Counter
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from polar.datasets import chat, rl, tokens
from polar.datasets.files import FORMATS, write_rows
from polar.datasets.select import SPLITS, Candidate, Selection, SplitBy, select, split
from polar.datasets.source import CaptureSource, ExportError, RolloutSource
from polar.datasets.stats import selection_stats
from polar.verify.errors import VerifyError
from polar.verify.results import Verification

MISMATCH_EXAMPLES = 5  # chat rows whose re-rendering differs, listed in stats.json


@dataclass
class ExportConfig:
    state: Path
    out: Path
    captures: Path | None = None  # None: no chat rows
    selection: Selection = field(default_factory=Selection)
    val_fraction: float = 0.1
    seed: int = 0
    split_by: SplitBy = "task"
    formats: tuple[str, ...] = FORMATS
    task_ids: frozenset[str] | None = None
    template: Any = None  # a polar.tokens.ChatTemplate: check every chat row re-renders to its tokens
    rl: bool = False
    verification: tuple[Path, ...] = ()  # `polar verify --json` results files (docs/verify.md)


@dataclass
class ExportResult:
    stats: dict[str, Any]
    files: list[Path]


def _progress(console: Console | None, show: bool):
    if not show:
        return nullcontext(None)
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    console=console, transient=True)


def _track(progress: Progress | None, items, description: str, total: int):
    if progress is None:
        yield from items
        return
    task = progress.add_task(description, total=total)
    for item in items:
        yield item
        progress.advance(task)


def _clear(out: Path) -> None:
    stale = [out / "stats.json", *(out / "rl" / f"groups.{f}" for f in FORMATS),
             *(out / kind / f"{s}.{f}" for kind in ("chat", "tokens") for s in SPLITS for f in FORMATS)]
    for path in stale:
        path.unlink(missing_ok=True)


def export_dataset(config: ExportConfig, console: Console | None = None, progress: bool = True) -> ExportResult:
    """Read, select, split and write; returns the statistics (also in OUT/stats.json) and the files."""
    for fmt in config.formats:
        if fmt not in FORMATS:
            raise ExportError(f"unknown format {fmt!r} (use {', '.join(FORMATS)})")
    if config.out.exists() and not config.out.is_dir():
        raise ExportError(f"{config.out} exists and is not a directory")
    if not 0.0 <= config.val_fraction < 1.0:
        raise ExportError(f"the validation fraction must be in [0, 1), got {config.val_fraction}")
    if config.selection.require_verified and not config.verification:
        raise ExportError("leaving out unverified trajectories needs a verification results file (polar verify --json)")
    verification = _verification(config.verification)
    source = RolloutSource(config.state)
    captures = CaptureSource(config.captures) if config.captures else None
    try:
        with _progress(console, progress) as bar:
            tasks = set(config.task_ids) if config.task_ids else None
            records = list(_track(bar, source.records(tasks), "reading sessions", source.count(tasks)))
            candidates = [Candidate(t, rec.result, rec.harness) for rec in records for t in rec.result.trajectories]
            if verification is not None:
                _mark_verified(candidates, verification)
            selected = select(candidates, config.selection)
            splits = split(selected.accepted, config.val_fraction, config.seed, config.split_by)
            stats = selection_stats(candidates, selected, splits)
            if verification is not None:
                stats["verification"] = verification.summary([c.trajectory for c in candidates])
            chat_rows = _chat_rows(splits, captures, config.template, bar, stats) if captures else None
            config.out.mkdir(parents=True, exist_ok=True)
            _clear(config.out)
            files = _write(config, splits, chat_rows, records, stats, candidates)
    finally:
        source.close()
        if captures:
            captures.close()
    stats["files"] = [str(p.relative_to(config.out)) for p in files]
    stats["settings"] = {"state": str(config.state), "captures": str(config.captures) if config.captures else None,
                         "selection": {**asdict(config.selection), "outcomes": sorted(config.selection.outcomes)},
                         "val_fraction": config.val_fraction, "seed": config.seed, "split_by": config.split_by,
                         "tasks": sorted(config.task_ids) if config.task_ids else None,
                         "verification": [str(p) for p in config.verification]}
    (config.out / "stats.json").write_text(json.dumps(stats, indent=2, ensure_ascii=False) + "\n")
    return ExportResult(stats, [*files, config.out / "stats.json"])


def _verification(paths: tuple[Path, ...]) -> Verification | None:
    if not paths:
        return None
    try:
        return Verification.load(*paths)
    except VerifyError as exc:
        raise ExportError(str(exc)) from None


def _mark_verified(candidates: list[Candidate], verification: Verification) -> None:
    for c in candidates:
        c.verification, record = verification.lookup(c.trajectory)
        c.verify_max_abs_diff = record.max_abs_diff if record else None


def _chat_rows(splits: dict[str, list[Candidate]], captures: CaptureSource, template, bar,
               stats: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    skipped: Counter = Counter()
    checked, exact, mismatches = 0, 0, []
    out: dict[str, list[dict[str, Any]]] = {}
    total = sum(len(v) for v in splits.values())
    pairs = ((name, c) for name, rows in splits.items() for c in rows)
    for name, c in _track(bar, pairs, "chat rows" + (" (checked against tokens)" if template else ""), total):
        try:
            row = chat.chat_row(c, captures.rows(c.trajectory.session_id))
        except chat.ChatRowError as exc:
            skipped[exc.reason] += 1
            continue
        out.setdefault(name, []).append(row)
        if template is not None:
            checked += 1
            problem = chat.rerender_mismatch(template, row, c.trajectory.token_ids)
            if problem is None:
                exact += 1
            elif len(mismatches) < MISMATCH_EXAMPLES:
                mismatches.append({"trajectory_id": c.trajectory.id, "problem": problem})
    stats["chat"] = {"rows": sum(len(v) for v in out.values()), "skipped": dict(skipped.most_common())}
    if template is not None:
        stats["chat"]["rerender"] = {"checked": checked, "exact": exact, "mismatches": mismatches}
    return out


def _write(config: ExportConfig, splits: dict[str, list[Candidate]], chat_rows: dict[str, list] | None,
           records: list, stats: dict[str, Any], candidates: list[Candidate]) -> list[Path]:
    files: list[Path] = []
    for name, rows in splits.items():
        if not rows:
            continue
        (config.out / "tokens").mkdir(exist_ok=True)
        files += write_rows([tokens.token_row(c) for c in rows], config.out / "tokens" / name, config.formats,
                            tokens.SCHEMA)
        if chat_rows and chat_rows.get(name):
            (config.out / "chat").mkdir(exist_ok=True)
            files += write_rows(chat_rows[name], config.out / "chat" / name, config.formats, chat.SCHEMA)
    if config.rl:
        harness = {rec.result.session_id: rec.harness for rec in records}
        groups = rl.rl_groups((rec.result for rec in records), harness_of=harness.get)
        rows = [row for g in groups for row in g.rows]
        kept = _verify_rl_rows(rows, candidates, config.selection.require_verified)
        stats["rl"] = {"groups": len(groups), "rows": len(kept), "groups_with_signal": sum(g.has_signal for g in groups),
                       "dropped_sessions": dict(sum((g.dropped for g in groups), Counter()))}
        if config.verification:
            stats["rl"]["rows_left_out_unverified"] = len(rows) - len(kept)
        rows = kept
        if rows:
            (config.out / "rl").mkdir(exist_ok=True)
            files += write_rows(rows, config.out / "rl" / "groups", config.formats, rl.SCHEMA)
    return files


def _verify_rl_rows(rows: list[dict[str, Any]], candidates: list[Candidate], require: bool) -> list[dict[str, Any]]:
    """Fill the RL rows' verification columns; the rows kept (only verified ones when `require`).
    Group statistics stay over every scored session: a row left out still had its reward."""
    by_id = {c.trajectory.id: c for c in candidates}
    kept = []
    for row in rows:
        c = by_id.get(row["trajectory_id"])
        if c is not None:
            row["verification"], row["verify_max_abs_diff"] = c.verification, c.verify_max_abs_diff
        if not require or row["verification"] == "verified":
            kept.append(row)
    return kept
