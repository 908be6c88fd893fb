"""`--upstream URL` (repeatable) and `--upstream-file FILE`: one vLLM server, or a fleet of replicas of one model."""

from __future__ import annotations

import click

DEFAULT_UPSTREAM = "http://127.0.0.1:8000"


def upstream_options(command):
    command = click.option(
        "--upstream-file", type=click.Path(exists=True, dir_okay=False),
        help="A file of vLLM base URLs, one a line ('#' comments): replicas of one model, added to --upstream.",
    )(command)
    return click.option(
        "--upstream", multiple=True, metavar="URL",
        help=f"vLLM base URL [default: {DEFAULT_UPSTREAM}]. Repeat it (or give a comma list) for a fleet of "
             "replicas serving one model: each session stays on the replica caching its prefix, failed replicas "
             "are taken out and their sessions move (polar/upstream/fleet).",
    )(command)


def joined_upstreams(upstream: tuple[str, ...], upstream_file: str | None) -> str:
    """The upstreams as the `polar_upstream` option holds them: one URL, or a comma list."""
    from polar.upstream.fleet.replicas import upstream_urls

    try:
        urls = upstream_urls(upstream, upstream_file)
    except (ValueError, OSError) as exc:
        raise click.BadParameter(str(exc), param_hint="--upstream") from None
    return ",".join(urls) or DEFAULT_UPSTREAM
