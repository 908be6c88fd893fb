"""Telling a stalled upstream from a busy one (`polar_upstream_stall`).

Silence alone does not mean a vLLM server stalled: it sends nothing while a request waits in its queue and
prefills (a stream's head comes with its first token, a whole answer comes whole), and a stream pauses
while the scheduler preempts it. So an answer that brings no byte for the stall bound asks the server's
health probe, on a connection of its own: a server that answers it is working and the call waits on (up to
the upstream timeout); one that does not — frozen, cut off the network, its engine dead (vLLM's /health
says 503 then) — has stalled, and the call fails at once as `upstream_timeout`, naming the stall (a fleet
takes the replica out and, when its client saw nothing yet, retries the call on another). What this cannot
see is an engine hung behind a live API server (its /health still answers): the upstream timeout bounds that.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from polar.errors import GatewayError
from polar.upstream.h1 import Answer, Pool

PROBE_PATHS = ("/health", "/v1/models")
PROBE_TIMEOUT = 5.0


async def get(url: str, path: str, timeout: float, headers: dict[str, str] | None = None) -> tuple[int, bytes] | None:
    """One GET on a connection of its own: (status, body), or None when the server did not answer in time."""
    pool = Pool(url, limit=1, connect_timeout=timeout, headers=headers or {})
    try:
        return await pool.fetch("GET", path, None, timeout)
    except (TimeoutError, OSError):
        return None
    finally:
        await pool.close()


async def answers(url: str, timeout: float, headers: dict[str, str] | None = None) -> bool:
    """Whether the server at `url` answers its health probe with 200 (a 404 on /health: tried on /v1/models)."""
    for path in PROBE_PATHS:
        reply = await get(url, path, timeout, headers)
        if reply is None:
            return False
        if reply[0] != 404:
            return reply[0] == 200
    return False


class Stall:
    """The stall bound on one upstream's answers: each `seconds` an answer brings nothing, its health probe."""

    def __init__(self, url: str, seconds: float, headers: dict[str, str] | None = None,
                 probe_timeout: float = PROBE_TIMEOUT):
        self.url, self.seconds, self.headers, self.probe_timeout = url, seconds, headers or {}, probe_timeout
        self._probe: asyncio.Task[bool] | None = None

    async def watch[T](self, work: Awaitable[T], discard: Callable[[T], None] | None = None) -> T:
        """`work` (a whole answer, or a stream's head): its own timeout bounds it; the stall bound, its silence.
        `discard`: what to do with a result that came as the caller gave up (close an answer's connection)."""
        task = asyncio.ensure_future(work)
        try:
            done, _ = await asyncio.wait({task}, timeout=self.seconds)
            if not done:
                await self._silent(task, "no byte of its answer")
            return task.result()
        except BaseException:
            if task.done() and not task.cancelled() and task.exception() is None and discard is not None:
                discard(task.result())
            raise
        finally:
            task.cancel()

    async def read(self, answer: Answer, timeout: float) -> bytes:
        """A stream's next bytes (Answer.read): within `timeout` in all, or TimeoutError; stalled: GatewayError."""
        try:
            return await answer.read(min(self.seconds, timeout))
        except TimeoutError:
            if timeout <= self.seconds:
                raise
        task = asyncio.ensure_future(answer.read(timeout - self.seconds))
        try:
            await self._silent(task, "no byte mid-stream")
            return task.result()
        finally:
            task.cancel()

    async def _silent(self, task: asyncio.Future, what: str) -> None:
        """`task` has brought nothing for `seconds`: probe the server every `seconds` until it does."""
        while not task.done():
            if not await self._answers() and not task.done():
                raise GatewayError("upstream_timeout", f"the upstream {self.url} stalled: {what} for "
                                                       f"{self.seconds:g} s, and its health probe failed too")
            await asyncio.wait({task}, timeout=self.seconds)

    async def _answers(self) -> bool:
        """The server's health probe, one at a time, shared by every call waiting on it: a busy server with many
        calls in its queue gets one probe, not one per call."""
        probe = self._probe
        if probe is None or probe.done() or probe.get_loop() is not asyncio.get_running_loop():
            probe = self._probe = asyncio.ensure_future(answers(self.url, self.probe_timeout, self.headers))
        return await asyncio.shield(probe)  # a caller giving up leaves the probe to the others
