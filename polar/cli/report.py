"""`polar report` — a self-contained HTML report of a run, from its rollout state and/or captures."""

from __future__ import annotations

from pathlib import Path

import click


@click.command()
@click.option("--state", "state_path", type=click.Path(dir_okay=False),
              help="Rollout state DB (rollout.db): outcomes, rewards, stage timings, scored trajectories.")
@click.option("--db", "captures_path", type=click.Path(dir_okay=False), multiple=True,
              help="Capture DB (captures.db): every model call; trajectories and drift are rebuilt from it. "
                   "Repeat it for a --ray run's node databases (captures-<node>.db), read as one run.")
@click.option("--out", default="report.html", show_default=True, type=click.Path(dir_okay=False),
              help="Where to write the HTML page.")
@click.option("--title", default="polar run report", show_default=True)
@click.option("--tokenizer", "tokenizer_dir", type=click.Path(exists=True, file_okay=False),
              help="Hugging Face tokenizer directory: decode the tokens around each prefix break.")
@click.option("--verification", multiple=True, type=click.Path(dir_okay=False),
              help="`polar verify --json` results of these captures: a verification section.")
@click.option("--upstream", "upstreams", multiple=True, metavar="URL",
              help="A fleet replica (vLLM base URL) to read /metrics from now: its prefix-cache hit rate in the "
                   "per-replica table.")
def report(state_path, captures_path, out, title, tokenizer_dir, verification, upstreams) -> None:
    """Write an HTML report of a run: rewards, tokens and turns, stage timings, trajectories, drift."""
    from polar.reporting import ReportInputError, write_report

    captures_path = list(captures_path) or None
    if state_path is None and captures_path is None:
        raise click.UsageError("give --state ROLLOUT_DB, --db CAPTURES_DB, or both")
    tokenizer = None
    if tokenizer_dir:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    metrics = {}
    if upstreams:
        import asyncio

        from polar.upstream.fleet.metrics import scrape
        from polar.upstream.fleet.replicas import upstream_urls

        try:
            urls = upstream_urls(upstreams)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--upstream") from None
        metrics = {url: asyncio.run(scrape(url, 10.0)) for url in urls}
    try:
        data = write_report(out, state_path, captures_path, tokenizer, title, verification, metrics)
    except ReportInputError as err:
        hint = {"state": "--state", "captures": "--db", "verification": "--verification"}.get(err.source)
        raise click.BadParameter(str(err), param_hint=hint) from None
    click.echo(f"wrote {Path(out)}: {len(data.sessions)} sessions, {len(data.trajectories)} trajectories, "
               f"{sum(t.broken_prefix for t in data.trajectories)} broken prefixes")
