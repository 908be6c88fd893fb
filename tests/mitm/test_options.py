"""polar's options are declared once (polar/config/options.py): mitmproxy's options, `polar proxy`'s flags, the flags
`polar rollout serve` shares and `ProxyConfig` all list the same ones, with the same defaults."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

from click.testing import CliRunner
from mitmproxy.test import taddons

from polar.cli.rollout import EMBEDDED_OPTIONS
from polar.cli.rollout import serve as rollout_serve
from polar.cli.serve import proxy
from polar.config.options import OPTIONS, SPEC
from polar.mitm.proxy import ProxyConfig, SubprocessProxy

REPO = Path(__file__).resolve().parents[2]


def _mitmproxy_options(tmp_path, monkeypatch) -> dict:
    from polar.mitm.addon import PolarAddon

    monkeypatch.chdir(tmp_path)  # loading configures every option once, the default database included
    with taddons.context(PolarAddon()) as tctx:
        return {name: option for name, option in tctx.options.items() if name.startswith("polar_")}


def test_mitmproxy_declares_each_spec_option_as_the_spec_says(tmp_path, monkeypatch):
    declared = _mitmproxy_options(tmp_path, monkeypatch)
    assert sorted(declared) == sorted(SPEC)
    for o in OPTIONS:
        got = declared[o.name]
        assert (got.typespec, got.help, tuple(got.choices or ())) == (o.type, o.help, o.choices), o.name
        assert got.default == (list(o.default) if o.type == Sequence[str] else o.default), o.name


def test_polar_proxy_has_a_flag_per_option_with_its_default():
    flags = {p.name: p for p in proxy.params}
    for o in OPTIONS:
        assert o.field in flags, o.name
        default = flags[o.field].default
        assert (list(default) if flags[o.field].multiple else default) == (list(o.default) if o.many else o.default)
    help_text = CliRunner().invoke(proxy, ["--help"], terminal_width=200).output
    assert all(f"{o.flag} " in help_text for o in OPTIONS)
    fields = {f.name: f for f in dataclasses.fields(ProxyConfig)}
    assert all(fields[o.field].default == o.default or o.many for o in OPTIONS)
    shared = {p.name: p.default for p in rollout_serve.params}
    assert all(shared[SPEC[n].field] == SPEC[n].default for n in EMBEDDED_OPTIONS)


def test_a_config_reaches_a_subprocess_proxy_flag_for_flag():
    """`SubprocessProxy` (benchmarks, `--workers`) starts `polar proxy` with the flags the spec derives."""
    changed = {"upstream": "http://127.0.0.1:9", "db": "x.db", "db_sync": "NORMAL", "hot_sessions": 7,
               "model_aliases": ["a", "b"], "drain": 3, "tokenizer": "/tok"}
    config = ProxyConfig(port=1234, **changed)
    args = SubprocessProxy(config).command()[4:]  # past `python -m polar.cli proxy`
    params = proxy.make_context("proxy", args).params
    for o in OPTIONS:
        value = params[o.field]
        assert (list(value) if o.many else value) == getattr(config, o.field), o.name
    assert config.option("polar_drain") == 3
    assert ProxyConfig(drain=3, extra={"polar_drain": "5"}).option("polar_drain") == 5  # --set wins, as in mitmproxy


def test_no_default_upstream_or_database_is_spelled_outside_the_spec():
    upstream, db = SPEC["polar_upstream"].default, SPEC["polar_db"].default
    for path in [*(REPO / "polar").rglob("*.py"), *(REPO / "addons").glob("*.py")]:
        if path.name != "options.py":
            text = path.read_text()
            assert upstream not in text and f'default="{db}"' not in text and f': str = "{db}"' not in text, path
