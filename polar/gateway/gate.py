"""The sampling gate: weight updates pause new model calls and wait for the ones in flight.

A trainer pauses sampling, waits for in-flight calls (`drain`), swaps weights and resumes with the
new policy version, which every call sampled from then on records. Paused calls wait, they are not
refused: harnesses just see a slower answer. A resume under a new version opens the gate once
`before_resume` has run (a fleet of replicas takes out those not serving that version). Use on the
proxy's event loop (from another thread: loop.call_soon_threadsafe / asyncio.run_coroutine_threadsafe).

Two names, each of one type: `policy_version` is the trainer's step (an int, as rollout/, captures,
trajectories and datasets hold it), given here; `weight_version` is the upstream's own label for the
weights that sampled a call (a str, vLLM's `weight_version`), which the call's result carries. Neither
stands in for the other.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

log = logging.getLogger("polar.gateway")


class SamplingGate:
    def __init__(self) -> None:
        self.policy_version: int | None = None
        self._open = asyncio.Event()
        self._open.set()
        self._in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self.before_resume: Callable[[int], Awaitable[None]] | None = None
        self._resuming: asyncio.Task | None = None
        self._checked: int | None = None  # the last version before_resume completed for

    def pause(self) -> None:
        if self._resuming is not None:
            self._resuming.cancel()
        self._open.clear()

    def resume(self, policy_version: int | None = None) -> None:
        if policy_version is not None:
            if isinstance(policy_version, bool) or not isinstance(policy_version, int):
                raise TypeError(f"a policy version is the trainer's step, an int: not {policy_version!r}")
            self.policy_version = policy_version
        version = self.policy_version
        if self.before_resume is not None and version is not None and version != self._checked:
            if self._resuming is not None:
                self._resuming.cancel()
            self._resuming = asyncio.get_running_loop().create_task(self._open_after(version))
            return
        self._open.set()

    async def _open_after(self, version: int) -> None:
        try:
            await self.before_resume(version)
            self._checked = version
        except asyncio.CancelledError:  # paused again meanwhile: stays shut
            return
        except Exception:  # noqa: BLE001 — a check that failed must not keep the gate shut for good
            log.exception("the check before resuming under %s failed; resuming anyway", version)
        self._resuming = None
        self._open.set()

    @property
    def in_flight(self) -> int:
        """Model calls being sampled right now."""
        return self._in_flight

    async def drain(self) -> None:
        """Return once no model call is being sampled."""
        await self._idle.wait()

    @asynccontextmanager
    async def sampling(self) -> AsyncIterator[None]:
        """Hold one in-flight slot while a call samples (waits while paused)."""
        await self._open.wait()
        self._in_flight += 1
        self._idle.clear()
        try:
            yield
        finally:
            self._in_flight -= 1
            if self._in_flight == 0:
                self._idle.set()
