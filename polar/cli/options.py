"""The gateway's options (polar/config/options.py) as click flags: `--upstream-model` for `polar_upstream_model`."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import click

from polar.config.options import OPTIONS, SPEC, Option


def _flag(o: Option) -> Callable:
    kwargs: dict = {"help": o.help}
    if o.type is bool:
        return click.option(f"{o.flag}/--no-{o.flag[2:]}", o.field, default=o.default, show_default=True, **kwargs)
    if o.many:
        return click.option(o.flag, o.field, multiple=True, default=list(o.default), metavar="TEXT",
                            help=f"{o.help} (once per item)")
    if o.sep:  # given once per item, joined (gateway_values); none given: the default
        return click.option(o.flag, o.field, multiple=True, metavar="TEXT", help=f"{o.help} [default: {o.default}]")
    if o.choices:
        kwargs["type"] = click.Choice(o.choices)
    elif o.type is int:
        kwargs["type"] = click.IntRange(min=o.min)
    elif o.path:
        kwargs["type"] = click.Path(dir_okay=False)
    return click.option(o.flag, o.field, default=o.default, show_default=o.default != "", **kwargs)


def gateway_flags(names: Iterable[str] | None = None) -> Callable:
    """Decorate a command with these options' flags (all of them by default), in the spec's order; each arrives
    as a parameter named like its `ProxyConfig` field."""
    chosen = [o for o in OPTIONS if names is None or o.name in set(names)]
    missing = set(names or ()) - set(SPEC)
    if missing:
        raise KeyError(f"no such polar options: {', '.join(sorted(missing))}")

    def decorate(command: Callable) -> Callable:
        for o in reversed(chosen):  # click lists the last decorator's option first
            command = _flag(o)(command)
        return command

    return decorate


def gateway_values(params: dict, names: Iterable[str] | None = None) -> dict:
    """The flags' values by field (lists as lists), for `ProxyConfig(**…)`."""
    return {o.field: list(params[o.field]) if o.many else (o.sep.join(params[o.field]) or o.default) if o.sep
            else params[o.field] for o in OPTIONS if names is None or o.name in set(names)}
