"""`polar trajectories` — build trajectories (and the drift report) from a captures database."""

from __future__ import annotations

import json
from pathlib import Path

import click

from polar.config.options import default


@click.command()
@click.option("--db", default=default("polar_db"), show_default=True, type=click.Path(dir_okay=False),
              help="Capture database (or the --db of `polar proxy --workers`: every worker's shard).")
@click.option("--builder", type=click.Choice(["per-request", "prefix-merge"]), default="prefix-merge",
              show_default=True, help="One sample per call, or calls merged along their shared prefixes.")
@click.option("--out", type=click.Path(dir_okay=False), help="Write trajectories here (.jsonl or .parquet).")
@click.option("--format", "fmt", type=click.Choice(["auto", "jsonl", "parquet", "both"]), default="auto",
              show_default=True, help="auto: by the suffix of --out; both: PATH.jsonl and PATH.parquet.")
@click.option("--session", help="Only this session.")
@click.option("--drift", is_flag=True, help="Print the drift report.")
@click.option("--drift-json", type=click.Path(dir_okay=False), help="Write the drift report as JSON.")
@click.option("--tokenizer", "tokenizer_dir", type=click.Path(exists=True, file_okay=False),
              help="Hugging Face tokenizer directory: decode the tokens around each prefix break.")
def trajectories(db, builder, out, fmt, session, drift, drift_json, tokenizer_dir) -> None:
    """Rebuild trajectories from captured calls; report where token prefixes drifted."""
    from polar.capture.shards import open_captures
    from polar.sqlite_files import WrongDatabase
    from polar.trajectories import BUILDERS, drift_report, io, summary
    from polar.trajectories.drift import print_drift

    paths = _outputs(out, fmt)  # a bad --out fails before any work
    try:
        rows = list(open_captures(db).calls(session=session))
    except WrongDatabase as exc:
        raise click.ClickException(str(exc)) from None
    built = BUILDERS[builder](rows)
    for path in paths:
        io.write(built, path)
        click.echo(f"wrote {len(built)} trajectories to {path}")
    if drift or drift_json:
        tokenizer = None
        if tokenizer_dir:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
        reports = drift_report(rows, tokenizer, trajectories=built if builder == "prefix-merge" else None)
        if drift:
            print_drift(reports)
        if drift_json:
            Path(drift_json).write_text(json.dumps([r.to_json() for r in reports], ensure_ascii=False, indent=1))
    counts = summary(rows, built)
    click.echo(
        f"{counts['sessions']} sessions, {counts['calls']} calls ({counts['samples']} sampled, "
        f"{counts['failed']} failed), {counts['trajectories']} {builder} trajectories, "
        f"{counts['trainable_tokens']} trainable tokens"
        + (f"; {counts['turns_without_logprobs']} turns without logprobs (null, never 0.0)"
           if counts.get("turns_without_logprobs") else "")
    )


def _outputs(out: str | None, fmt: str) -> list[Path]:
    if out is None:
        if fmt != "auto":
            raise click.UsageError("--format needs --out")
        return []
    path = Path(out)
    if fmt == "both":
        return [path.with_suffix(".jsonl"), path.with_suffix(".parquet")]
    if fmt != "auto":
        return [path.with_suffix(f".{fmt}")]
    if path.suffix not in (".jsonl", ".parquet"):
        raise click.BadParameter("use a .jsonl or .parquet path, or --format", param_hint="--out")
    return [path]
