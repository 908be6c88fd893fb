"""The fleet as one Backend: the gateway pipeline drives it as it drives a single upstream.

Each call is placed by the router (routing.py) and sampled by that replica's own backend (a TokenFaithful
or VLLMChat of its own). A replica that refuses the connection, answers 5xx, stalls (its upstream timeout, or
the stall bound: polar/upstream/stall.py) or breaks off is taken out (replicas.py) and probed until it answers
again (health.py); its sessions move on their next call, and stay token-faithful there, since the prompt is
built from the ids polar holds, not from the replica's cache.
A call the failed replica was answering is sent once more, to another replica, if nothing of the answer
has reached the client yet (a whole answer, or a stream that yielded no text); one that had begun to
stream ends with the provider's error, as with a single upstream. The result and the error both name the
replica (the capture row's `replica`), and a retried call's result names the replica that failed it.

One policy version across the fleet: when the sampling gate resumes under a new version (gateway/gate.py),
it opens only after `adopt_version` asked every replica which weights it serves (vLLM's /weight_info, whose
label the trainer's update set to the step: fleet/weights.py); one that serves other weights, or does not
answer, is taken out, and a probe takes it back only once it serves the fleet's version. So no call samples
on older weights after a resume.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Sequence
from typing import Any

from polar.canonical import ChatRequest, ChatResult, Delta
from polar.errors import GatewayError
from polar.sessions.state import SessionView
from polar.tokens.shaping import TemplateTraits
from polar.upstream.base import Backend, UpstreamStream
from polar.upstream.fleet.health import NO_VERSION, Prober, weight_version
from polar.upstream.fleet.metrics import hit_rate, scrape
from polar.upstream.fleet.replicas import Held, Replica, replica_failed
from polar.upstream.fleet.routing import CallShape, Router, call_shape
from polar.upstream.stall import answers

log = logging.getLogger("polar.fleet")


class FleetBackend:
    def __init__(self, replicas: Sequence[tuple[str, Backend]], imbalance: float = 1.5, probe_interval: float = 2.0,
                 probe_headers: dict[str, str] | None = None, probe_timeout: float = 5.0):
        if not replicas:
            raise ValueError("a fleet needs at least one replica")
        self.replicas = [Replica(url.rstrip("/"), backend) for url, backend in replicas]
        self.router = Router(self.replicas, imbalance)
        self.prober = Prober(self.replicas, self._ready, probe_interval)
        self.probe_headers, self.probe_timeout = probe_headers or {}, probe_timeout
        self.policy_version: int | None = None  # the trainer's step the fleet last resumed under

    # -- one policy version ----------------------------------------------------------------------

    async def adopt_version(self, version: int) -> None:
        """The gate resumes under `version`: every replica not serving it leaves the fleet until it does."""
        self.policy_version = version
        found = await asyncio.gather(*(weight_version(r.url, self.probe_timeout, self.probe_headers)
                                       for r in self.replicas))
        for replica, serves in zip(self.replicas, found, strict=True):
            if serves == NO_VERSION:  # cannot tell: the trainer's own update (fleet/weights.py) vouches for it
                replica.weight_version = None
            elif serves == str(version):
                replica.weight_version = serves
            else:
                why = "does not answer" if serves is None else f"serves weight version {serves}"
                if replica.take_out(f"{why}; the fleet resumed under policy version {version}"):
                    log.warning("replica %s taken out of the fleet: it %s, the fleet resumed under %s",
                                replica.url, why, version)
                self.prober.wake()

    async def _ready(self, replica: Replica) -> bool:
        """A probe: it answers, and serves the fleet's policy version (when both it and the fleet name one)."""
        if not await answers(replica.url, self.probe_timeout, self.probe_headers):
            return False
        if self.policy_version is None:
            return True
        serves = await weight_version(replica.url, self.probe_timeout, self.probe_headers)
        if serves in (NO_VERSION, str(self.policy_version)):
            replica.weight_version = None if serves == NO_VERSION else serves
            return True
        return False

    # -- what the gateway asks of any backend ----------------------------------------------------

    async def model(self) -> str:
        """The served model's name, from the first replica that answers (they all serve the same model)."""
        failure: GatewayError | None = None
        for replica in sorted(self.replicas, key=lambda r: not r.up):
            try:
                return await replica.backend.model()
            except GatewayError as err:
                failure = err
                self._failed(replica, err)
        assert failure is not None
        raise failure

    def template_traits(self) -> TemplateTraits | None:
        return self.replicas[0].backend.template_traits()

    async def count_tokens(self, request: ChatRequest) -> int:
        replica = next((r for r in self.replicas if r.up), self.replicas[0])
        return await replica.backend.count_tokens(request)

    async def context_length(self) -> int | None:
        """The served window, for model listings and probes (every replica serves the same model)."""
        replica = next((r for r in self.replicas if r.up), self.replicas[0])
        return await replica.backend.context_length()

    async def aclose(self) -> None:
        await self.prober.aclose()
        await asyncio.gather(*(r.backend.aclose() for r in self.replicas))

    async def complete(self, request: ChatRequest, call_id: str, session: SessionView | None = None) -> ChatResult:
        shape = call_shape(request, session)
        replica, failovers = self._place(shape, ()), []
        while True:
            held = replica.hold(shape.tokens)
            try:
                result = await replica.backend.complete(request, call_id, session)
            except GatewayError as err:
                retry = self._retry(shape, replica, err, failovers)
                if retry is None:
                    raise
                replica = retry
                continue
            finally:
                held.release()
            return _tagged(result, replica, failovers)

    async def stream(self, request: ChatRequest, call_id: str, session: SessionView | None = None) -> UpstreamStream:
        shape = call_shape(request, session)
        stream = FleetStream(self, request, call_id, session, shape)
        await stream.start(self._place(shape, ()))
        return stream

    # -- placing, failing over -----------------------------------------------------------------------

    def _place(self, shape: CallShape, tried: Sequence[Replica]) -> Replica:
        placement = self.router.place(shape, tried)
        if placement is not None:
            return placement.replica
        if tried:
            raise GatewayError("upstream_unavailable", "no other replica of the fleet is in to retry the call on")
        # Every replica is out: the one out longest is tried (a probe may not have seen it come back yet).
        return min(self.replicas, key=lambda r: r.out_since or 0.0)

    def _failed(self, replica: Replica, err: GatewayError) -> bool:
        """Take the replica out when the failure is its own (True then)."""
        err.replica = err.replica or replica.url
        if not replica_failed(err):
            return False
        if replica.take_out(err):
            log.warning("replica %s taken out of the fleet: %s", replica.url, err.message)
        self.prober.wake()
        return True

    def _retry(self, shape: CallShape, replica: Replica, err: GatewayError, failovers: list[str]) -> Replica | None:
        """Where a call that failed on `replica` before its client saw anything goes next (once), or None."""
        if not self._failed(replica, err) or failovers:
            return None
        placement = self.router.place(shape, [replica])
        if placement is None:
            return None
        failovers.append(f"{replica.url}: {err.kind}: {err.message}")
        log.info("call retried on %s after %s failed it", placement.replica.url, replica.url)
        return placement.replica

    def status(self) -> dict[str, Any]:
        """Per replica: in or out, calls and tokens in flight, failures, sessions held, its prefix-cache hit
        rate as last scraped; routing's choices."""
        sessions = self.router.sessions_on()
        replicas = [{**r.status(), "sessions": sessions.get(r.url, 0), "prefix_cache_hit_rate": hit_rate(r.metrics)}
                    for r in self.replicas]
        return {"replicas": replicas, "routing": dict(self.router.counts), "imbalance": self.router.imbalance,
                "policy_version": self.policy_version}

    async def report(self, timeout: float | None = None) -> dict[str, Any]:
        """`status` with every replica's vLLM metrics scraped now (those that do not answer within `timeout`,
        default the probes', keep their last)."""
        wait = timeout or self.probe_timeout
        found = await asyncio.gather(*(scrape(r.url, wait, self.probe_headers) for r in self.replicas))
        for replica, metrics in zip(self.replicas, found, strict=True):
            if metrics is not None:
                replica.metrics = metrics
        return self.status()


class FleetStream:
    """A streamed call on one replica, moved once to another if that one fails before any text was yielded."""

    def __init__(self, fleet: FleetBackend, request: ChatRequest, call_id: str, session: SessionView | None,
                 shape: CallShape):
        self.fleet, self.request, self.call_id, self.session, self.shape = fleet, request, call_id, session, shape
        self.failovers: list[str] = []
        self.replica: Replica | None = None
        self.inner: UpstreamStream | None = None
        self._held: Held | None = None
        self._yielded = False  # text (or a tool call) went toward the client: no retry from then on

    async def start(self, replica: Replica) -> None:
        """Send the call to `replica` (on its refusal, once to another). The stream, its replica and its share of
        the load change together: what a failed start leaves is the stream before it, with its own replica."""
        while True:
            held = replica.hold(self.shape.tokens)
            try:
                inner = await replica.backend.stream(self.request, self.call_id, self.session)
            except GatewayError as err:
                held.release()
                retry = self.fleet._retry(self.shape, replica, err, self.failovers)
                if retry is None:
                    raise
                replica = retry
                continue
            self.replica, self.inner, self._held = replica, inner, held
            return

    async def _switch(self, err: GatewayError) -> bool:
        """The replica failed the call before the client saw any of it: start it on another (once)."""
        assert self.replica is not None and self.inner is not None
        if self._yielded:  # the client has part of the answer: it gets the error (the replica may still go out)
            self.fleet._failed(self.replica, err)
            return False
        retry = self.fleet._retry(self.shape, self.replica, err, self.failovers)
        if retry is None:
            return False
        await self.inner.aclose()
        self._release()
        await self.start(retry)  # (its failure names its replica: fleet._failed)
        return True

    @property
    def prompt_tokens(self) -> int | None:
        return self.inner.prompt_tokens if self.inner is not None else None

    async def accepted(self, timeout: float | None) -> bool:
        while True:
            assert self.inner is not None
            try:
                return await self.inner.accepted(timeout)
            except GatewayError as err:
                if not await self._switch(err):
                    raise

    async def __aiter__(self) -> AsyncIterator[list[Delta]]:
        while True:
            assert self.inner is not None
            try:
                async for deltas in self.inner:
                    self._yielded = self._yielded or bool(deltas)
                    yield deltas
                return
            except GatewayError as err:
                if not await self._switch(err):
                    raise

    def result(self) -> ChatResult:
        assert self.inner is not None and self.replica is not None
        return _tagged(self.inner.result(), self.replica, self.failovers)

    def partial(self) -> ChatResult:
        assert self.inner is not None and self.replica is not None
        return _tagged(self.inner.partial(), self.replica, self.failovers)

    async def aclose(self) -> None:
        try:
            if self.inner is not None:
                await self.inner.aclose()
        finally:
            self._release()

    def _release(self) -> None:
        if self._held is not None:
            self._held.release()
            self._held = None


def _tagged(result: ChatResult, replica: Replica, failovers: list[str]) -> ChatResult:
    result.replica = replica.url
    result.failovers = list(failovers)
    return result
