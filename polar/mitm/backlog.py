"""A listen backlog sized for agents that connect all at once.

mitmproxy listens through `asyncio.start_server`, whose backlog is 100 connections. Lock-step agents
(256 sessions starting a turn together, a trainer's group of rollouts) connect in bursts while the proxy's
one event loop is busy: beyond 100 waiting connections the kernel drops their SYNs (a second or more of
retransmits each) or answers with SYN cookies, and clients saw `ReadError`s. Linux takes a second
`listen()` on a listening socket as a new backlog; the kernel still caps it at net.core.somaxconn
(4096 by default since Linux 5.4).
"""

from __future__ import annotations

import logging
import os
import socket
from typing import Any

log = logging.getLogger("polar.backlog")

LISTEN_BACKLOG = 4096


def listening_sockets(proxyserver: Any) -> list[Any]:
    """The TCP sockets mitmproxy's proxy servers listen on (asyncio's `Server.sockets`)."""
    found = []
    for instance in proxyserver.servers:
        # An asyncio-served mode's servers (WireGuard/UDP have none): mitmproxy names no public accessor for
        # them, so the use is pinned in tests/mitm/test_mitmproxy_private.py.
        for server in getattr(instance, "_servers", ()):
            found += [s for s in getattr(server, "sockets", ()) if s.type == socket.SOCK_STREAM]
    return found


def widen(proxyserver: Any, backlog: int = LISTEN_BACKLOG) -> None:
    """Re-listen every proxy socket with `backlog` (one that refuses keeps its own, with a warning)."""
    for sock in listening_sockets(proxyserver):
        try:
            with socket.socket(fileno=os.dup(sock.fileno())) as same:  # the same socket: closing it keeps sock
                same.listen(backlog)
        except OSError as exc:
            log.warning("could not widen the listen backlog of %s: %s", sock.getsockname(), exc)


class BacklogAddon:
    """Widens the servers mitmproxy has just opened (a mode changed later keeps asyncio's 100)."""

    def running(self) -> None:
        from mitmproxy import ctx

        if (proxyserver := ctx.master.addons.get("proxyserver")) is not None:
            widen(proxyserver)
