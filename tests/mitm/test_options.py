"""polar's options are declared once (polar/config/options.py): mitmproxy's options, `polar proxy`'s flags, the flags
`polar rollout serve` shares and `ProxyConfig` all list the same ones, with the same defaults."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

from click.testing import CliRunner
from mitmproxy.test import taddons

from polar.cli.options import gateway_values
from polar.cli.rollout import EMBEDDED_OPTIONS
from polar.cli.rollout import serve as rollout_serve
from polar.cli.serve import proxy
from polar.config.options import OPTIONS, SPEC
from polar.mitm.proxy import ProxyConfig, SubprocessProxy

REPO = Path(__file__).resolve().parents[2]


def _mitmproxy_options(tmp_path, monkeypatch) -> dict:
    from polar.mitm.chain import polar_addons

    monkeypatch.chdir(tmp_path)  # loading configures every option once, the default database included
    with taddons.context(*polar_addons()) as tctx:
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
    defaults = gateway_values(proxy.make_context("proxy", []).params)  # as the command reads its flags
    for o in OPTIONS:
        assert o.field in flags, o.name
        assert defaults[o.field] == (list(o.default) if o.many else o.default), o.name
    help_text = CliRunner().invoke(proxy, ["--help"], terminal_width=200).output
    assert all(f"{o.flag} " in help_text for o in OPTIONS)
    fields = {f.name: f for f in dataclasses.fields(ProxyConfig)}
    assert all(fields[o.field].default == o.default or o.many for o in OPTIONS)
    shared = gateway_values(rollout_serve.make_context("serve", []).params, EMBEDDED_OPTIONS)
    assert all(shared[SPEC[n].field] == SPEC[n].default for n in EMBEDDED_OPTIONS)


def test_a_config_reaches_a_subprocess_proxy_flag_for_flag():
    """`SubprocessProxy` (benchmarks, `--workers`) starts `polar proxy` with the flags the spec derives."""
    changed = {"upstream": "http://127.0.0.1:9", "db": "x.db", "db_sync": "NORMAL", "hot_sessions": 7,
               "model_aliases": ["a", "b"], "drain": 3, "tokenizer": "/tok"}
    config = ProxyConfig(port=1234, **changed)
    args = SubprocessProxy(config).command()[4:]  # past `python -m polar.cli proxy`
    values = gateway_values(proxy.make_context("proxy", args).params)
    for o in OPTIONS:
        assert values[o.field] == getattr(config, o.field), o.name
    assert config.option("polar_drain") == 3
    assert ProxyConfig(drain=3, extra={"polar_drain": "5"}).option("polar_drain") == 5  # --set wins, as in mitmproxy


def test_no_default_upstream_or_database_is_spelled_outside_the_spec():
    upstream, db = SPEC["polar_upstream"].default, SPEC["polar_db"].default
    for path in [*(REPO / "polar").rglob("*.py"), *(REPO / "addons").glob("*.py")]:
        if path.name != "options.py":
            text = path.read_text()
            assert upstream not in text and f'default="{db}"' not in text and f': str = "{db}"' not in text, path


def test_each_option_is_declared_by_the_one_addon_that_reads_it_and_both_entry_points_load_the_same_chain():
    import runpy

    from polar.mitm.chain import polar_addons

    declared: dict[str, list[str]] = {}

    class Recording:  # stands in for mitmproxy's Loader: records who declares what
        def __init__(self, addon):
            self.addon = addon

        def add_option(self, name, *args, **kwargs):
            declared.setdefault(name, []).append(type(self.addon).__name__)

    chain = polar_addons()
    for addon in chain:
        if hasattr(addon, "load"):
            addon.load(Recording(addon))
    assert sorted(declared) == sorted(SPEC) and all(len(by) == 1 for by in declared.values()), declared
    assert declared["polar_drain"] == ["DrainAddon"]  # declared where it is read (mitm/shutdown.py)
    script = runpy.run_path(str(REPO / "addons" / "polar_gateway.py"))["addons"]
    assert [type(a) for a in script] == [type(a) for a in chain]


def test_a_set_option_joins_the_first_configure(tokenizer_dir, tmp_path):
    """`--set polar_chat_template=FILE` beside `--tokenizer DIR` whose directory has no template of its own: the
    gateway is built once with both (a first configure with the tokenizer alone would refuse to start)."""
    import json
    import shutil
    import time

    from polar.mitm.proxy import free_port
    from polar.tokens.template import ChatTemplate

    bare = tmp_path / "vocabulary"
    bare.mkdir()
    shutil.copy(tokenizer_dir / "tokenizer.json", bare)
    config = json.loads((tokenizer_dir / "tokenizer_config.json").read_text())
    template = tmp_path / "template.jinja"
    template.write_text(config.pop("chat_template", None) or ChatTemplate.from_dir(tokenizer_dir).template_text)
    (bare / "tokenizer_config.json").write_text(json.dumps(config))

    def started(extra: dict) -> bool:
        proxy = SubprocessProxy(ProxyConfig(port=free_port(), tokenizer=str(bare), db=str(tmp_path / "c.db"),
                                            extra=extra))
        try:
            proxy.start()
            time.sleep(2)  # a refused configure ends the process right after start-up
            return proxy.proc.poll() is None
        except RuntimeError:
            return False
        finally:
            proxy.stop()

    assert started({"polar_chat_template": str(template)})
    assert not started({})  # the check above would see the refusal
    assert ProxyConfig(extra={"polar_hot_sessions": "9"}).polar_options()["polar_hot_sessions"] == 9
