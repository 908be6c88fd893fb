"""`polar export` — a rollout run's accepted trajectories as SFT / token / RL datasets."""

from __future__ import annotations

import json
from pathlib import Path
from typing import get_args

import click

from polar.rollout.tasks import Outcome


def _formats(ctx, param, value: str) -> tuple[str, ...]:
    from polar.datasets.files import FORMATS

    formats = tuple(dict.fromkeys(f.strip().lower() for f in value.split(",") if f.strip()))
    unknown = [f for f in formats if f not in FORMATS]
    if unknown or not formats:
        raise click.BadParameter(f"use a comma-separated list of {', '.join(FORMATS)} (got {value!r})")
    return formats


@click.command("export")
@click.option("--state", "state_path", required=True, type=click.Path(dir_okay=False),
              help="Rollout state database (rollout.db) holding the scored sessions.")
@click.option("--captures", "captures_path", type=click.Path(dir_okay=False),
              help="Capture database (captures.db) of the same run: needed for chat rows.")
@click.option("--out", required=True, type=click.Path(file_okay=False), help="Output directory.")
@click.option("--min-reward", type=float, help="Keep trajectories whose reward is at least this (and present).")
@click.option("--outcome", "outcomes", multiple=True, default=("ok",), show_default=True,
              type=click.Choice(get_args(Outcome)), help="Session outcomes kept (repeat for several).")
@click.option("--include-truncated", is_flag=True, help="Keep trajectories with a turn cut at the token limit.")
@click.option("--include-partial", is_flag=True, help="Keep sessions cut at their deadline and conversations that "
                                                       "went on in failed calls.")
@click.option("--drop-broken-prefix", is_flag=True,
              help="Leave out trajectories whose prompt re-rendered an earlier turn instead of continuing it.")
@click.option("--verification", "verification", multiple=True, type=click.Path(exists=True, dir_okay=False),
              help="`polar verify --json` results of these captures: rows carry each trajectory's verdict.")
@click.option("--drop-unverified", is_flag=True,
              help="Leave out trajectories the verification file does not show within tolerance (needs it).")
@click.option("--no-dedup", is_flag=True, help="Keep identical trajectories (same tokens and mask) more than once.")
@click.option("--val-fraction", default=0.1, show_default=True, type=click.FloatRange(0, 1, max_open=True),
              help="Share of groups (see --split-by) that go to the validation split.")
@click.option("--split-by", type=click.Choice(["task", "session", "trajectory"]), default="task", show_default=True,
              help="What never straddles the two splits.")
@click.option("--seed", default=0, show_default=True, type=int, help="Split seed.")
@click.option("--format", "formats", default="jsonl,parquet", show_default=True, callback=_formats,
              help="File formats: jsonl, parquet or both (comma-separated).")
@click.option("--task", "task_ids", multiple=True, help="Only these tasks.")
@click.option("--rl", is_flag=True, help="Also write RL batch rows (GRPO groups with advantages) to OUT/rl/.")
@click.option("--tokenizer", "tokenizer_dir", type=click.Path(exists=True, file_okay=False),
              help="Tokenizer dir of the policy: check that every chat row re-renders to its exact tokens.")
@click.option("--chat-template", type=click.Path(exists=True, dir_okay=False),
              help="Jinja chat template for that check (default: the tokenizer's own).")
@click.option("--json", "as_json", is_flag=True, help="Print the statistics as JSON instead of tables.")
@click.option("--quiet", is_flag=True, help="No progress bars.")
def export(state_path, captures_path, out, min_reward, outcomes, include_truncated, include_partial,
           drop_broken_prefix, verification, drop_unverified, no_dedup, val_fraction, split_by, seed, formats, task_ids, rl, tokenizer_dir,
           chat_template, as_json, quiet) -> None:
    """Export a rollout run's accepted trajectories: chat rows, token rows, train/validation splits."""
    from rich.console import Console

    from polar.datasets.export import ExportConfig, export_dataset
    from polar.datasets.select import Selection
    from polar.datasets.source import ExportError
    from polar.datasets.stats import stats_tables, summary_lines

    if drop_unverified and not verification:
        raise click.UsageError("--drop-unverified needs --verification FILE (the lines of polar verify --json)")
    if chat_template and not tokenizer_dir:
        raise click.UsageError("--chat-template needs --tokenizer")
    if tokenizer_dir and not captures_path:
        raise click.UsageError("--tokenizer checks chat rows, which need --captures")
    template = None
    if tokenizer_dir:
        from polar.tokens.template import ChatTemplate

        try:
            template = ChatTemplate.from_dir(tokenizer_dir, chat_template)
        except (OSError, ValueError) as exc:
            raise click.BadParameter(f"cannot load a tokenizer and chat template: {exc}",
                                     param_hint="--tokenizer") from None
    selection = Selection(min_reward=min_reward, outcomes=frozenset(outcomes), include_partial=include_partial,
                          include_truncated=include_truncated, include_broken_prefix=not drop_broken_prefix,
                          dedup=not no_dedup, require_verified=drop_unverified)
    config = ExportConfig(state=Path(state_path), out=Path(out),
                          captures=Path(captures_path) if captures_path else None,
                          selection=selection, val_fraction=val_fraction, seed=seed, split_by=split_by,
                          formats=formats, task_ids=frozenset(task_ids) or None, template=template, rl=rl,
                          verification=tuple(Path(p) for p in verification))
    console = Console(stderr=True)
    try:
        result = export_dataset(config, console=console, progress=not quiet)
    except ExportError as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        click.echo(json.dumps(result.stats, indent=2, ensure_ascii=False))
        return
    out_console = Console()
    for table in stats_tables(result.stats):
        out_console.print(table)
    for line in summary_lines(result.stats):
        out_console.print(line)
    out_console.print(f"wrote {', '.join(result.stats['files']) or 'no rows'} in {config.out}")
