"""Stopping polar on SIGTERM or SIGINT without losing a call — `polar proxy`, and mitmproxy's own `mitmdump` or
`mitmweb` running the addon script (the addon installs this as mitmproxy starts, in place of mitmproxy's
handlers, which shut down at once).

Both signals stop it, as they stop mitmdump; SIGTERM is what `docker stop`, Kubernetes and polar's own
`--workers` supervisor send. The first signal drains: new calls are refused with a 503 in their provider's
shape (the SDKs retry: another process, or this one restarted, serves them), and the calls in flight go on
for up to `polar_drain` seconds. Any still running then are ended, each captured with what was sampled: a
stream with its provider's error event, a call waiting upstream with an error answer (the gateway addon's
`stop_calls`). Then mitmproxy shuts down: the relay, the upstream client and the capture writer close, and
the process exits 0. A second signal cuts the wait short.

Without this, SIGTERM killed the process outright: a stream in flight was cut mid-event and its row stayed
`pending` until a writer next opened the database.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import subprocess
import threading
from typing import Any

from mitmproxy import ctx, exceptions

from polar.config.options import add_options, check

log = logging.getLogger("polar.shutdown")

DRAIN_OPTIONS = ("polar_drain",)

SIGNALS = (signal.SIGTERM, signal.SIGINT)
STOP_MARGIN_S = 15  # past the drain: ending what is left and closing the writer, before a supervisor kills
# mitmproxy sends an answer once the addon's hook returns, and has no hook for "sent": the last answers
# get this long on a running loop (local writes) before shutting down cancels the connections' tasks.
_WRITE_S = 0.2


def stop_wait_s(config: Any) -> int:
    """How long a supervisor waits for a stopped `polar proxy` (its `ProxyConfig`) before killing it."""
    return config.option("polar_drain") + STOP_MARGIN_S


def wait_or_signal(proc: subprocess.Popen, seconds: float, then: int = signal.SIGKILL) -> None:
    """Wait up to `seconds` for a stopping child; then send it `then` (a kill is waited for)."""
    try:
        proc.wait(timeout=max(0.1, seconds))
    except subprocess.TimeoutExpired:
        proc.send_signal(then)
        if then == signal.SIGKILL:
            proc.wait(timeout=10)


class DrainAddon:
    """Installs the drain as mitmproxy starts (`running`); reads `polar_drain` when a signal comes. `gateway`: the
    gateway addon, whose calls it waits for and ends."""

    def __init__(self, gateway: Any) -> None:
        self.gateway = gateway

    def load(self, loader: Any) -> None:
        add_options(loader, DRAIN_OPTIONS)

    def configure(self, updated: set[str]) -> None:
        try:
            check(ctx.options, updated & set(DRAIN_OPTIONS))
        except ValueError as exc:
            raise exceptions.OptionsError(str(exc)) from None

    def running(self) -> None:
        install(ctx.master, self.gateway)


def install(master: Any, addon: Any) -> None:
    """Stop gracefully on the first signal, at once on the second (signal handlers: the main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        return  # an in-process proxy (BackgroundProxy): its owner stops it
    loop = asyncio.get_running_loop()
    cut_short = asyncio.Event()
    tasks: list[asyncio.Task] = []

    def on_signal(signum: int) -> None:
        if tasks:
            log.warning("polar: %s again: stopping now", signal.Signals(signum).name)
            cut_short.set()
            return
        log.warning("polar: %s: no new calls; waiting up to %d s for %d in flight", signal.Signals(signum).name,
                    ctx.options.polar_drain, addon.in_flight())
        tasks.append(loop.create_task(_stop(master, addon, ctx.options.polar_drain, cut_short)))

    for signum in SIGNALS:
        loop.add_signal_handler(signum, on_signal, signum)


async def _stop(master: Any, addon: Any, drain_s: float, cut_short: asyncio.Event) -> None:
    addon.stopping = True
    try:
        await asyncio.wait_for(_drained(addon, cut_short), timeout=drain_s)
    except TimeoutError:
        pass
    if addon.in_flight():
        log.warning("polar: ending %d calls still in flight", addon.in_flight())
        await addon.stop_calls()  # while mitmproxy still serves: each answer reaches its client
        await asyncio.sleep(_WRITE_S)
    master.shutdown()  # then the gateway addon's `done` closes the relay, the upstream client and the writer


async def _drained(addon: Any, cut_short: asyncio.Event) -> None:
    while addon.in_flight() and not cut_short.is_set():
        await asyncio.sleep(0.05)


def quiet_cancelled(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """The loop's error handler once polar has stopped: connections still open (a client's idle keep-alive)
    are cancelled as the loop closes, and asyncio would print each handler's CancelledError as an error."""
    if not isinstance(context.get("exception"), asyncio.CancelledError):
        loop.default_exception_handler(context)
