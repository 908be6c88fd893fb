"""Taking a failed replica back in: while any replica is out, each is probed every `interval` seconds (GET
/health, vLLM's liveness endpoint; a server without it, GET /v1/models) and taken back in once it answers 200
and, once the fleet resumed under a policy version, serves that version (GET /weight_info, when the server
has it: vLLM in dev mode). Probes (polar/upstream/stall.py) have their own short timeout: a stalled replica is
not waited on for a whole call's timeout.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence

import orjson

from polar.upstream.fleet.replicas import Replica
from polar.upstream.stall import get

log = logging.getLogger("polar.fleet")

NO_VERSION = "no /weight_info"  # the server does not say which weights it serves (vLLM without dev mode)


async def weight_version(url: str, timeout: float, headers: dict[str, str] | None = None) -> str | None:
    """The label of the weights the server serves (vLLM's /weight_info), NO_VERSION when it has no such endpoint,
    None when it does not answer."""
    reply = await get(url, "/weight_info", timeout, headers)
    if reply is None:
        return None
    status, body = reply
    if status in (404, 405):
        return NO_VERSION
    try:
        return str(orjson.loads(body)["weight_version"]) if status == 200 else None
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return None


class Prober:
    def __init__(self, replicas: Sequence[Replica], ready: Callable[[Replica], Awaitable[bool]], interval: float = 2.0):
        self.replicas, self.ready, self.interval = list(replicas), ready, interval
        self._task: asyncio.Task | None = None

    def wake(self) -> None:
        """A replica went out: probe until every replica is back (on the running loop)."""
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while out := [r for r in self.replicas if not r.up]:
            await asyncio.sleep(self.interval)
            results = await asyncio.gather(*(self.ready(r) for r in out))
            for replica, ok in zip(out, results, strict=True):
                if ok and not replica.up:
                    replica.take_in()
                    log.warning("replica %s answers again: taken back in", replica.url)

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
