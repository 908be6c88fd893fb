"""`--upstream-file FILE` beside the repeatable `--upstream URL`: a fleet of vLLM replicas of one model."""

from __future__ import annotations

import click


def upstream_file_option(command):
    return click.option(
        "--upstream-file", type=click.Path(exists=True, dir_okay=False),
        help="A file of vLLM base URLs, one a line ('#' comments): replicas of one model, added to --upstream.",
    )(command)


def add_upstream_file(options: dict, upstream_file: str | None) -> None:
    """The --upstream values (`options['upstream']`) checked, deduplicated, with the file's URLs added."""
    from polar.upstream.fleet.replicas import upstream_urls

    try:
        options["upstream"] = tuple(upstream_urls(options["upstream"], upstream_file))
    except (ValueError, OSError) as exc:
        raise click.BadParameter(str(exc), param_hint="--upstream") from None
