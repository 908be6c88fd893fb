"""The mitmproxy master `polar proxy` runs: the default addons polar uses, and hooks sent only where they land.

mitmproxy's addon manager sends every hook to every addon of its chain: per addon a `safecall` context,
a coroutine, a generator over the addon and its children, whether or not the addon implements the hook —
and each flow hook is followed by an `update` hook that only mitmweb's view takes. For a small call that
is ~130 addon visits, most of them to addons without the hook: the bulk of what the four flow hooks cost,
and what visiting only the addons that implement a hook leaves out. `HookedAddons` skips an addon that neither implements the
hook nor holds child addons (`ScriptLoader` holds the `-s` scripts' addons: always visited), finds those
once per hook name (again when the chain changes), and reads a hook's arguments once, not once per addon;
everything else — order, error logging per addon, `AddonHalt` — is mitmproxy's own `trigger_event`.
"""

from __future__ import annotations

import inspect
import types
from typing import Any

from mitmproxy import addonmanager, exceptions, hooks
from mitmproxy.addons import termlog
from mitmproxy.master import Master

# mitmproxy's default addons that rewrite, replay, block or record flows, or serve mitm.it: polar
# answers every call itself and uses none of them, yet each one's hooks run on every flow. mitmweb
# (`web`) keeps them all, for inspection.
UNUSED_ADDONS = frozenset({
    "AntiCache", "AntiComp", "BlockList", "Browser", "ClientPlayback", "CommandHistory", "Comment", "Cut",
    "Export", "MapLocal", "MapRemote", "ModifyBody", "ModifyHeaders", "Onboarding", "SaveHar",
    "ServerPlayback", "StickyAuth", "StickyCookie",
})


class HookedAddons(addonmanager.AddonManager):
    """mitmproxy's addon manager, visiting on each hook only the addons that can take it."""

    def __init__(self, master: Any) -> None:
        super().__init__(master)
        self._takers: dict[str, list[Any]] = {}  # hook name → the chain's addons that can take it

    def add(self, *addons: Any) -> None:
        self._takers.clear()  # the chain changes: found again on each hook's next call
        super().add(*addons)

    def remove(self, addon: Any) -> None:
        self._takers.clear()
        super().remove(addon)

    def clear(self) -> None:
        self._takers.clear()
        super().clear()

    async def trigger_event(self, event: hooks.Hook) -> None:
        name = event.name
        takers = self._takers.get(name)
        if takers is None:  # an addon that neither implements the hook nor holds child addons is never called
            takers = self._takers[name] = [a for a in self.chain
                                           if getattr(a, name, None) is not None or hasattr(a, "addons")]
        args = None  # the hook's arguments, read once (mitmproxy reads them for every addon it calls)
        for addon in takers:
            try:
                with addonmanager.safecall():
                    for func in _hooks(addon, name):
                        if args is None:
                            args = event.args()
                        res = func(*args)
                        if res is not None and inspect.isawaitable(res):  # async and sync hooks, as mitmproxy
                            await res
            except exceptions.AddonHalt:
                return


def _hooks(addon: Any, name: str):
    """The addon's and its children's callables for hook `name`, as mitmproxy's manager finds them (its
    `traverse`; a module imported under a hook's name is no hook)."""
    for a in addonmanager.traverse([addon]):
        func = getattr(a, name, None)
        if func is None or isinstance(func, types.ModuleType):
            continue
        if not callable(func):
            raise exceptions.AddonManagerError(f"Addon handler {name} ({a}) not callable")
        yield func


class LeanMaster(Master):
    """DumpMaster's addons without the unused ones, on `HookedAddons`: proxying, TLS, auth, DNS,
    `save_stream_file` and `scripts` stay; the unused addons' options are not registered."""

    def __init__(self, opts: Any) -> None:
        from mitmproxy import addons
        from mitmproxy.addons import errorcheck

        super().__init__(opts, with_termlog=False)
        self.addons = HookedAddons(self)  # before any addon registers with the manager
        # Master's own slot (its shutdown uninstalls the log handler): pinned in tests/mitm/test_mitmproxy_private.py.
        self._termlog_addon = termlog.TermLog()
        self.addons.add(self._termlog_addon)
        self.addons.add(*(a for a in addons.default_addons() if type(a).__name__ not in UNUSED_ADDONS))
        self.addons.add(errorcheck.ErrorCheck())  # start-up errors stop the proxy (not KeepServing: replay's)
