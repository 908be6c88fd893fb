"""`polar …` — a thin click layer over the library: one module per command group."""

from __future__ import annotations

import click

from polar.cli.demo import demo
from polar.cli.export import export
from polar.cli.paths import DEFAULT_CACHE, DEFAULT_TOKENIZER
from polar.cli.report import report
from polar.cli.rollout import rollout, submit
from polar.cli.serve import captures, double, proxy
from polar.cli.tasks import evaluate, tasks
from polar.cli.templates import templates
from polar.cli.trajectories import trajectories
from polar.cli.verify import verify


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="polar")
def main() -> None:
    """polar: capture token-level truth from unchanged agent harnesses, in front of vLLM."""


for command in (proxy, double, captures, trajectories, verify, demo, rollout, submit, export, report, evaluate, tasks,
                templates):
    main.add_command(command)

__all__ = ["main", "DEFAULT_CACHE", "DEFAULT_TOKENIZER"]
