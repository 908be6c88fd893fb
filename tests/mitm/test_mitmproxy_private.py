"""The private mitmproxy names polar still reaches, each pinned to the mitmproxy it was checked against.

A new mitmproxy fails the first test: re-read each use below against its source, then update the version.
"""

from __future__ import annotations

import inspect

import mitmproxy.version
from mitmproxy.master import Master
from mitmproxy.proxy import mode_servers

CHECKED_AGAINST = "12.2.3"


def test_the_mitmproxy_polar_was_checked_against():
    assert mitmproxy.version.VERSION == CHECKED_AGAINST, (
        f"mitmproxy {mitmproxy.version.VERSION}: re-check the private names in tests/mitm/test_mitmproxy_private.py")


def test_master_uninstalls_the_termlog_it_holds_in_its_own_slot():
    """polar/mitm/master.py: LeanMaster sets `Master._termlog_addon` as `Master.__init__(with_termlog=True)` would
    (its addon manager is polar's own, so the termlog is added after it), for `Master.done` to uninstall."""
    assert "self._termlog_addon = termlog.TermLog()" in inspect.getsource(Master.__init__)
    assert "self._termlog_addon.uninstall()" in inspect.getsource(Master.done)


def test_asyncio_served_modes_keep_their_servers_where_the_backlog_finds_them():
    """polar/mitm/backlog.py reads `AsyncioServerInstance._servers` (asyncio servers, with `.sockets`); the
    backlog test (test_backlog.py) checks the widened sockets themselves."""
    assert "self._servers = []" in inspect.getsource(mode_servers.AsyncioServerInstance.__init__)
    assert "asyncio.Server" in str(mode_servers.AsyncioServerInstance.__annotations__["_servers"])
