"""The lean master's hook dispatch: the same calls, in the same order, as mitmproxy's own addon manager.

Run against mitmproxy's real default addons and real flow hooks; only the recording addons are the test's.
"""

from __future__ import annotations

import asyncio
import logging

from mitmproxy import addonmanager, exceptions, options
from mitmproxy.addons import script
from mitmproxy.proxy.layers.http import (
    HttpRequestHeadersHook,
    HttpRequestHook,
    HttpResponseHeadersHook,
    HttpResponseHook,
)
from mitmproxy.test import tflow

from polar.mitm.master import UNUSED_ADDONS, HookedAddons, LeanMaster


class Recorder:
    def __init__(self, name: str, log: list):
        self.name, self.log = name, log

    def request(self, flow):
        self.log.append((self.name, "request"))

    async def response(self, flow):  # async hooks are awaited, as mitmproxy does
        await asyncio.sleep(0)
        self.log.append((self.name, "response"))

    def update(self, flows):
        self.log.append((self.name, "update"))


class Parent:
    """An addon holding children, as ScriptLoader holds the `-s` scripts' addons."""

    def __init__(self, children):
        self.addons = children


class Failing:
    def request(self, flow):
        raise ValueError("boom")


class Halting:
    def request(self, flow):
        raise exceptions.AddonHalt()


def flow_hooks(flow):
    return [HttpRequestHeadersHook(flow), HttpRequestHook(flow), HttpResponseHeadersHook(flow), HttpResponseHook(flow)]


async def calls_made(manager_class, make_addons) -> list:
    """What a master on `manager_class` calls, for the four flow hooks of one flow."""
    log: list = []
    master = LeanMaster(options.Options())
    master.addons = manager_class(master)
    master.addons.add(*make_addons(log))
    flow = tflow.tflow(resp=True)
    for hook in flow_hooks(flow):
        await master.addons.handle_lifecycle(hook)
    await master.done()  # its log handlers off again
    return log


def chain(log):
    return [Recorder("a", log), Failing(), Parent([Recorder("child", log), Parent([Recorder("grandchild", log)])]),
            Recorder("b", log), Halting(), Recorder("after-halt", log)]


def test_same_calls_in_the_same_order_as_mitmproxys_manager(caplog):
    caplog.set_level(logging.ERROR)
    ours = asyncio.run(calls_made(HookedAddons, chain))
    theirs = asyncio.run(calls_made(addonmanager.AddonManager, chain))
    assert ours == theirs
    # What that order is: children after their parent, `update` after each flow hook, nothing after AddonHalt.
    assert ours[:3] == [("a", "update"), ("child", "update"), ("grandchild", "update")]
    assert ("a", "request") in ours and ("after-halt", "request") not in ours
    assert ("after-halt", "response") in ours  # a halt stops that hook only
    # The failing addon's error is logged, as mitmproxy logs it, and the hook went on to the next addons.
    assert [r.getMessage() for r in caplog.records if "boom" in r.getMessage()] == ["Addon error: boom"] * 2
    assert ours.index(("child", "request")) > ours.index(("a", "request"))


def test_lean_master_has_the_default_addons_polar_uses():
    master = asyncio.run(made_and_done())
    names = {type(a).__name__ for a in master.addons.chain}
    assert {"Core", "Proxyserver", "NextLayer", "TlsConfig", "ScriptLoader", "Save", "ErrorCheck", "TermLog"} <= names
    assert not names & UNUSED_ADDONS
    assert isinstance(master.addons, HookedAddons)
    assert master.addons.get("scriptloader") is not None


def test_a_script_loaded_with_s_gets_every_hook(tmp_path):
    """`mitmdump -s`-style scripts live under ScriptLoader: the lean master still reaches them."""
    path = tmp_path / "tag.py"
    path.write_text("seen = []\ndef request(flow):\n    seen.append(flow.request.path)\n")
    asyncio.run(script_gets_hooks(path))


async def script_gets_hooks(path):
    master = LeanMaster(options.Options())
    master.options.update(scripts=[str(path)])
    loader = master.addons.get("scriptloader")
    assert isinstance(loader, script.ScriptLoader) and loader.addons
    for _ in range(500):  # mitmproxy loads the script on a task of its own
        if loader.addons[0].ns is not None:
            break
        await asyncio.sleep(0.01)
    flow = tflow.tflow()
    await master.addons.trigger_event(HttpRequestHook(flow))
    assert loader.addons[0].ns.seen == [flow.request.path]
    await master.done()


async def made_and_done() -> LeanMaster:
    master = LeanMaster(options.Options())  # a master needs a running event loop
    await master.done()
    return master
