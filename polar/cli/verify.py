"""`polar verify` — recompute every sampled token's logprob with the served weights and compare (docs/verify.md).

Exit status: 0 every trajectory within tolerance, 1 some trajectory is not (or has no logprobs to check),
2 the check could not run (bad input, no torch, a model that does not fit the captures).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from polar.verify.compare import DEFAULT_RATIO_THRESHOLD, DEFAULT_TOLERANCE


class _CannotVerify(click.ClickException):
    exit_code = 2  # 1 means "verified, and something is off"


@click.command()
@click.option("--db", required=True, type=click.Path(dir_okay=False), help="Capture database.")
@click.option("--model", "model_dir", required=True, type=click.Path(file_okay=False),
              help="The weights vLLM serves (a Hugging Face checkpoint directory).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per trajectory per line (the results file).")
@click.option("--out", type=click.Path(dir_okay=False), help="Also write the JSON lines to this file.")
@click.option("--tolerance", default=DEFAULT_TOLERANCE, show_default=True, type=click.FloatRange(min=0),
              help="Largest |Δ logprob| a token may show (measured default: bf16 serving, fp32 recompute).")
@click.option("--ratio-threshold", default=DEFAULT_RATIO_THRESHOLD, show_default=True, type=click.FloatRange(min=0),
              help="Count tokens whose importance ratio exp(Δ) is off 1 by more than this (reported).")
@click.option("--python", "python", help="A Python with torch + transformers to run the forward pass "
                                         "[env POLAR_VERIFY_PYTHON; default: this one, if torch imports].")
@click.option("--dtype", type=click.Choice(["float32", "bfloat16", "float16", "auto"]), default="float32",
              show_default=True, help="Recompute dtype (auto: the checkpoint's own); logprobs are float32 always.")
@click.option("--device", default="auto", show_default=True, help="cpu, cuda, cuda:N (auto: cuda when present).")
@click.option("--builder", type=click.Choice(["prefix-merge", "per-request"]), default="prefix-merge",
              show_default=True, help="How trajectories are rebuilt from the captured calls.")
@click.option("--session", help="Only this session.")
@click.option("--chunk", default=1024, show_default=True, type=click.IntRange(min=1),
              help="Tokens per forward step (the KV cache carries the rest): bounds the memory for logits.")
def verify(db, model_dir, as_json, out, tolerance, ratio_threshold, python, dtype, device, builder, session,
           chunk) -> None:
    """Check that the served weights give the captured logprobs for every sampled token."""
    from polar.verify import Tolerance, VerifyError
    from polar.verify import verify as run_verify

    try:
        limits = Tolerance(tolerance, ratio_threshold)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--tolerance / --ratio-threshold") from None
    # The results file appears whole or not at all: lines go to OUT.partial, renamed once the run is done.
    partial = Path(f"{out}.partial") if out else None
    sink = partial.open("w", encoding="utf-8") if partial else None

    def emit(check) -> None:
        line = json.dumps(check.to_json())  # ASCII: any session id survives any terminal and file
        if as_json:
            click.echo(line)
        if sink:
            sink.write(line + "\n")
            sink.flush()

    try:
        run = run_verify(db, model_dir, python=python, dtype=dtype, device=device, builder=builder, session=session,
                         tolerance=limits, chunk=chunk, on_check=emit)
    except VerifyError as exc:
        if partial:
            sink.close()
            partial.unlink(missing_ok=True)
        raise _CannotVerify(str(exc)) from None
    if partial:
        sink.close()
        partial.replace(out)
    if not as_json:
        _print_table(run)
    click.echo(_summary_line(run.summary()), err=as_json)
    sys.exit(0 if run.ok else 1)


def _fmt(x: float | None, digits: int = 4) -> str:
    return "-" if x is None else f"{x:.{digits}g}"


def _print_table(run) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"verify: {run.worker.get('model')} ({run.worker.get('dtype')}, {run.worker.get('device')})")
    widest = min(60, max((len(c.trajectory) for c in run.checks), default=10))
    table.add_column("trajectory", min_width=widest, no_wrap=True)
    for name in ("tokens", "missing", "mean |Δ|", "max |Δ|", "ratio off", "spikes at"):
        table.add_column(name, justify="left" if name == "spikes at" else "right")
    table.add_column("status", no_wrap=True)
    for c in run.checks:
        spikes = ", ".join(map(str, c.spike_positions[:8])) + (" …" if c.spikes > 8 else "")
        table.add_row(c.trajectory, str(c.tokens), str(c.missing), _fmt(c.mean_abs_diff), _fmt(c.max_abs_diff),
                      _fmt(c.ratio_off, 3), spikes or "-", c.status if c.ok else f"[bold red]{c.status}[/]")
    Console().print(table)


def _summary_line(s: dict) -> str:
    d = s["abs_diff"]
    spread = ", ".join(f"{k} {_fmt(v)}" for k, v in d.items())
    parts = [f"{s['ok']}/{s['trajectories']} trajectories within |Δ| ≤ {s['tolerance']:g}",
             f"{s['tokens']} tokens compared ({spread})"]
    if s["mismatch"]:
        parts.append(f"{s['mismatch']} out of tolerance ({s['spikes']} spikes)")
        if s["spikes"] > s["tokens"] / 2:  # a few altered tokens spike locally; nearly all is another model
            parts.append("most tokens are off: is --model the weights that served these captures (and --dtype sane)?")
    if s["missing"] or s["no_logprobs"]:
        parts.append(f"{s['missing']} sampled tokens without captured logprobs, not compared "
                     f"({s['no_logprobs']} trajectories with none)")
    return "; ".join(parts)
