"""A burst of connections while polar's event loop is busy: every one is queued by the kernel, none dropped.

A real `polar proxy` is stopped (SIGSTOP: its loop accepts nothing, as while it works through a turn of 256
agent calls) and 300 clients connect at once. With asyncio's listen backlog of 100 the kernel dropped the
SYNs beyond it (the 256-session benchmark saw `ReadError`s and SYN cookies); polar re-listens with
mitm/backlog.py's 4096, so all 300 complete their handshake and, once polar runs again, are answered.
"""

from __future__ import annotations

import os
import selectors
import signal
import socket
import subprocess
import time

from polar.mitm.backlog import LISTEN_BACKLOG
from polar.mitm.proxy import ProxyConfig, SubprocessProxy, free_port

CLIENTS = 300


def connect_all(port: int, n: int, within_s: float) -> list[socket.socket]:
    """Start n non-blocking connects; those whose handshake completes within `within_s`."""
    pending, done = [], []
    sel = selectors.DefaultSelector()
    for _ in range(n):
        s = socket.socket()
        s.setblocking(False)
        s.connect_ex(("127.0.0.1", port))
        sel.register(s, selectors.EVENT_WRITE)
        pending.append(s)
    deadline = time.monotonic() + within_s
    while sel.get_map() and time.monotonic() < deadline:
        for key, _ in sel.select(timeout=max(0.0, deadline - time.monotonic())):
            s = key.fileobj
            sel.unregister(s)
            if s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0:
                done.append(s)
    for s in pending:
        if s not in done:
            s.close()
    return done


def backlog_of(port: int) -> int | None:
    """The listen backlog of the socket on `port`, as `ss` shows it (Send-Q of a listening socket)."""
    out = subprocess.run(["ss", "-ltnH", f"sport = :{port}"], capture_output=True, text=True, check=True).stdout.split()
    return int(out[2]) if len(out) >= 3 else None


def answer(s: socket.socket, within_s: float) -> bytes:
    s.setblocking(True)
    s.settimeout(within_s)
    s.sendall(b"GET / HTTP/1.1\r\nHost: polar\r\nConnection: close\r\n\r\n")
    out = b""
    while chunk := s.recv(65536):
        out += chunk
    return out


def test_a_burst_of_connections_while_polar_is_busy_is_queued_not_dropped(tmp_path):
    proxy = SubprocessProxy(ProxyConfig(upstream="http://127.0.0.1:9", db=str(tmp_path / "captures.db"),
                                        port=free_port()))
    proxy.start()
    connected: list[socket.socket] = []
    try:
        # Connections are taken from the first listen(); the backlog widens once mitmproxy reports running.
        want = min(LISTEN_BACKLOG, int(open("/proc/sys/net/core/somaxconn").read()))
        deadline = time.monotonic() + 30
        while backlog_of(proxy.config.port) != want and time.monotonic() < deadline:
            time.sleep(0.05)
        assert backlog_of(proxy.config.port) == want
        os.kill(proxy.proc.pid, signal.SIGSTOP)
        try:
            connected = connect_all(proxy.config.port, CLIENTS, within_s=2.0)
        finally:
            os.kill(proxy.proc.pid, signal.SIGCONT)
        assert len(connected) == min(CLIENTS, want), f"{CLIENTS - len(connected)} handshakes dropped by a full listen queue"
        answers = [answer(s, within_s=60) for s in connected]
        assert all(a.startswith(b"HTTP/1.1 200") and a.endswith(b"polar gateway\n") for a in answers)
    finally:
        for s in connected:
            s.close()
        proxy.stop()
