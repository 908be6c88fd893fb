"""The rollout service: accepts tasks, dispatches their sessions to gateway nodes, persists results.

Nodes are reached through `NodeHandle`: `LocalNode` wraps a `GatewayNode` on this event loop (the
embedded default), `polar.rollout.ray_nodes.RayNode` wraps one running as a Ray actor. The service
pulls each node's stage changes and results and commits them to `RolloutState` before a trainer can
see them, so a crash loses nothing that was reported. Sessions go to the healthy node with the
fewest unfinished sessions.

A node whose event stream fails is logged and tried again with capped exponential backoff; it shows
as unhealthy in `status()` (last error, since when). Once it has been unhealthy for `node_grace`
seconds, its unfinished sessions start again as new attempts on healthy nodes, or fail with the
cause when there is none; anything it reports later about them is ignored. A node whose stream
recovers is healthy again.

A node that is gone for good (its handle raises `NodeLost`: a Ray actor whose machine died) will not
recover, so there is no grace period: its unfinished sessions move at once, the service stops
listening to it and never dispatches to it again, and `status()` shows it lost.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, Protocol

from polar.capture.reader import CaptureReader
from polar.rollout.health import NodeHealth
from polar.rollout.node import GatewayNode
from polar.rollout.state import RolloutState
from polar.rollout.tasks import SessionResult, SessionSpec, TaskSpec

log = logging.getLogger("polar.rollout.service")
_CALL_TIMEOUT_S = 5.0  # for calls to a node that may not answer (status, cancelling what it lost)
_SCRAPE_TIMEOUT_S = 2.0  # for a replica's /metrics in a node's status: a stalled one must not cost the node its line


class NodeLost(Exception):
    """Raised by a node handle whose node will never answer again (its process or machine died for
    good), as opposed to a failure worth retrying: the service then moves its sessions at once."""


class NodeHandle(Protocol):
    """A node the service dispatches to. Any call may raise `NodeLost`; other errors are transient."""

    name: str

    async def submit(self, spec: SessionSpec) -> None: ...

    async def cancel(self, session_ids: list[str]) -> None: ...

    async def pause(self) -> None: ...

    async def resume(self, policy_version: int | None) -> None: ...

    async def in_flight_calls(self) -> int: ...

    async def events(self, timeout: float) -> list[tuple[str, Any]]: ...

    async def stats(self) -> dict[str, Any]: ...

    async def close(self) -> None: ...


class LocalNode:
    """A node on the service's own event loop."""

    def __init__(self, node: GatewayNode, capture_db: str | None = None):
        self.node = node
        self.name = node.config.name
        self.capture_db = capture_db
        node.start()

    async def submit(self, spec: SessionSpec) -> None:
        self.node.submit(spec)

    async def cancel(self, session_ids: list[str]) -> None:
        self.node.cancel(session_ids)

    async def pause(self) -> None:
        self.node.pause()
        if (gateway := self._gateway()) is not None:  # hold new model calls, not just new sessions
            await asyncio.to_thread(gateway.pause_sampling)

    async def resume(self, policy_version: int | None) -> None:
        if (gateway := self._gateway()) is not None:
            await asyncio.to_thread(gateway.resume_sampling, policy_version)  # the gate labels calls with it
        self.node.resume(policy_version)

    async def in_flight_calls(self) -> int:
        if (gateway := self._gateway()) is not None:
            return gateway.addon.gate.in_flight
        return await asyncio.to_thread(pending_calls, self.capture_db)

    def _gateway(self):
        env = getattr(getattr(self.node, "phases", None), "env", None)
        return getattr(env, "gateway", None)

    async def events(self, timeout: float) -> list[tuple[str, Any]]:
        return await self.node.next_events(timeout)

    async def stats(self) -> dict[str, Any]:
        return with_fleet(self.node.stats(), await fleet_view(self._gateway()))

    async def close(self) -> None:
        await self.node.stop()
        close = getattr(self.node.phases, "close", None)
        if close:
            close()


async def fleet_view(gateway: Any) -> dict[str, Any] | None:
    """An embedded gateway's fleet of upstream replicas as a node's status shows it — per replica: in or out,
    calls and tokens in flight, failures, its vLLM's prefix-cache hit rate (scraped now) — or None when the
    gateway has one upstream (or none: a simulated node). The local node and each Ray node actor report it so."""
    backend = getattr(getattr(getattr(gateway, "addon", None), "gateway", None), "backend", None)
    if not hasattr(backend, "report"):
        return None
    report = asyncio.run_coroutine_threadsafe(backend.report(_SCRAPE_TIMEOUT_S), gateway.master.event_loop)
    return await asyncio.wrap_future(report)  # on the proxy's own loop, where the fleet lives


def with_fleet(stats: dict[str, Any], fleet: dict[str, Any] | None) -> dict[str, Any]:
    return {**stats, "fleet": fleet} if fleet is not None else stats


def pending_calls(capture_db: str | None) -> int:
    """Model calls the gateway has started and not finished (rows still `pending`)."""
    if not capture_db or not Path(capture_db).is_file():
        return 0
    conn = CaptureReader(capture_db).connect()
    try:
        return conn.execute("SELECT count(*) FROM calls WHERE status = 'pending'").fetchone()[0]
    finally:
        conn.close()


class RolloutService:
    def __init__(self, state: RolloutState, nodes: list[NodeHandle], node_grace: float = 60.0,
                 backoff_cap: float = 30.0):
        if not nodes:
            raise ValueError("the rollout service needs at least one node")
        self.state = state
        self.nodes = nodes
        self.node_grace = node_grace  # seconds a node may stay unhealthy before its sessions move
        self._health = {id(node): NodeHealth(backoff_cap=backoff_cap) for node in nodes}
        self._owner: dict[str, NodeHandle] = {}  # unfinished session → its node
        self._new_result = asyncio.Condition()
        self._pumps: list[asyncio.Task] = []
        self.started = time.time()

    @property
    def policy_version(self) -> int | None:
        value = self.state.get("policy_version")
        return None if value is None else int(value)

    @property
    def paused(self) -> bool:
        return self.state.get("paused") == "1"

    async def start(self) -> None:
        """Resume where a previous run stopped: settings, then every unfinished session."""
        await self._on_live(lambda node: node.resume(self.policy_version))
        if self.paused:
            await self._on_live(lambda node: node.pause())
        self._pumps = [asyncio.create_task(self._pump(node), name=f"pump-{node.name}") for node in self._live()]
        for spec in self.state.requeue():
            await self._dispatch(spec)

    async def close(self) -> None:
        for pump in self._pumps:
            pump.cancel()
        await asyncio.gather(*self._pumps, return_exceptions=True)
        for node in self._live():  # a lost node's processes are gone with it
            try:
                await node.close()
            except Exception as exc:  # one node failing to stop must not keep the others running
                log.warning("node %s: could not close it: %s", node.name, exc)

    # -- trainer API -----------------------------------------------------------------------

    async def submit(self, tasks: list[TaskSpec]) -> list[dict[str, Any]]:
        ids = [t.id for t in tasks]
        taken = sorted({i for i in ids if ids.count(i) > 1 or self.state.has_task(i)})
        if taken:  # all or nothing: a trainer retrying a batch must not get half of it twice
            raise ValueError(f"task ids already submitted or repeated: {', '.join(taken)}")
        accepted = []
        for task in tasks:
            if task.policy_version is None:
                task = task.model_copy(update={"policy_version": self.policy_version})
            sessions = self.state.add_task(task)
            for spec in sessions:
                await self._dispatch(spec)
            accepted.append({"task_id": task.id, "sessions": [s.session_id for s in sessions]})
        return accepted

    async def results(self, after: int = 0, follow: bool = True, include_drained: bool = False,
                      heartbeat: float = 5.0) -> AsyncIterator[tuple[int, SessionResult] | None]:
        """Finished session results in completion order; with `follow`, wait for more.
        Yields None after `heartbeat` seconds without a result (lets a stream notice a gone client)."""
        while True:
            idle = False
            # Read under the condition's lock: a result stored after this read is notified after the
            # wait below has begun, so no wake-up is lost.
            async with self._new_result:
                batch = self.state.results(after, undrained_only=not include_drained)
                if not batch and follow:
                    try:
                        await asyncio.wait_for(self._new_result.wait(), heartbeat)
                    except TimeoutError:
                        idle = True
            if not batch and not follow:
                return
            for seq, result in batch:
                after = seq
                yield seq, result
            if idle:
                yield None

    def ack(self, seqs: list[int]) -> int:
        return self.state.ack(seqs)

    async def cancel(self, task_id: str) -> int:
        session_ids = self.state.cancel_task(task_id)
        for node in self._live():  # every node: a session may yet move to one that does not run it now
            try:
                await asyncio.wait_for(node.cancel(session_ids), _CALL_TIMEOUT_S)
            except Exception as exc:  # an unhealthy node must not keep the others from hearing it
                log.warning("node %s: could not cancel task %s there: %s", node.name, task_id, exc)
        return len(session_ids)

    async def pause(self, policy_version: int | None = None, drain_timeout: float = 60.0) -> dict[str, Any]:
        """Stop starting sessions and wait until no model call is in flight (for a weight update)."""
        self.state.put("paused", "1")
        if policy_version is not None:
            self.state.put("policy_version", str(policy_version))
        await self._on_live(lambda node: node.pause())
        deadline = time.monotonic() + drain_timeout
        while (in_flight := sum(await self._on_live(lambda node: node.in_flight_calls()))) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        return {"paused": True, "in_flight_calls": in_flight, "policy_version": self.policy_version}

    async def resume(self, policy_version: int | None = None) -> dict[str, Any]:
        if policy_version is not None:
            self.state.put("policy_version", str(policy_version))
        self.state.put("paused", "0")
        await self._on_live(lambda node: node.resume(self.policy_version))
        return {"paused": False, "policy_version": self.policy_version}

    async def status(self) -> dict[str, Any]:
        nodes = list(await asyncio.gather(*(self._node_status(node) for node in self.nodes)))
        return {**self.state.counts(), "policy_version": self.policy_version, "paused": self.paused,
                "uptime": time.time() - self.started, "nodes": nodes,
                "unhealthy_nodes": [n["node"] for n in nodes if not n["healthy"]],
                "lost_nodes": [n["node"] for n in nodes if n["lost"]]}

    async def _node_status(self, node: NodeHandle) -> dict[str, Any]:
        stats: dict[str, Any] = {}
        if not self._health[id(node)].lost:  # nothing to ask a lost node
            try:
                stats = await asyncio.wait_for(node.stats(), _CALL_TIMEOUT_S)
            except Exception as exc:  # an unreachable node still has a line in the status
                stats = {"stats_error": f"{type(exc).__name__}: {exc}"}
        return {**stats, "node": node.name, **self._health[id(node)].as_dict()}

    # -- internals -------------------------------------------------------------------------

    def _healthy(self) -> list[NodeHandle]:
        return [node for node in self.nodes if self._health[id(node)].healthy]

    def _live(self) -> list[NodeHandle]:
        """Nodes not lost for good (healthy or not)."""
        return [node for node in self.nodes if not self._health[id(node)].lost]

    async def _on_live(self, call: Callable[[NodeHandle], Awaitable[Any]]) -> list[Any]:
        """`call(node)` on every live node; one found lost on the way is evacuated, not raised."""
        answers = []
        for node in self._live():
            try:
                answers.append(await call(node))
            except NodeLost as exc:
                await self._lose(node, exc)
        return answers

    async def _dispatch(self, spec: SessionSpec) -> None:
        while live := self._live():
            load = Counter(id(owner) for owner in self._owner.values())
            # With no healthy node, a live one is picked anyway: its grace period requeues or fails the session.
            node = min(self._healthy() or live, key=lambda n: load[id(n)])
            self._owner[spec.session_id] = node
            try:
                await node.submit(spec)
                return
            except NodeLost as exc:
                if self._owner.get(spec.session_id) is not node:  # its evacuation already moved it
                    return
                self._owner.pop(spec.session_id)
                await self._lose(node, exc)
        await self._fail([spec], "no node left: every node is lost", None)

    async def _pump(self, node: NodeHandle) -> None:
        health = self._health[id(node)]
        while not health.lost:
            try:
                events = await node.events(1.0)
            except asyncio.CancelledError:
                raise
            except NodeLost as exc:
                await self._lose(node, exc)
                return
            except Exception as exc:
                await self._stream_failed(node, health, exc)
                continue
            if not health.healthy:
                log.warning("node %s: event stream recovered after %d failures", node.name, health.recovered())
            finished = await asyncio.to_thread(self._persist, node, events)
            await self._finished(finished)

    async def _stream_failed(self, node: NodeHandle, health: NodeHealth, exc: Exception) -> None:
        """Log the failure, wait out the backoff, and once the grace period is over move the node's sessions."""
        wait = health.failed(exc)
        log.warning("node %s: event stream failed (%d in a row, unhealthy since %s; next try in %.1fs): %s",
                    node.name, health.failures, health.describe_since(), wait, health.last_error,
                    exc_info=exc if health.failures == 1 else None)
        to_grace = self.node_grace - health.unhealthy_for()
        if 0 < to_grace < wait:  # the grace period ends before the next try: act on time
            await asyncio.sleep(to_grace)
            wait -= to_grace
        if health.unhealthy_for() >= self.node_grace:
            await self._evacuate(node, health)
        await asyncio.sleep(wait)

    async def _lose(self, node: NodeHandle, exc: NodeLost) -> None:
        """A node gone for good: no grace period, its sessions move now and it is never used again."""
        health = self._health[id(node)]
        if health.lost:
            return
        health.gone(exc)
        log.warning("node %s lost for good, moving its sessions now: %s", node.name, exc)
        await self._evacuate(node, health)  # its pump sees `lost` and stops

    async def _evacuate(self, node: NodeHandle, health: NodeHealth) -> None:
        """Start a lost node's unfinished sessions again elsewhere, or fail them with the cause."""
        lost = [sid for sid, owner in self._owner.items() if owner is node]
        if not lost:
            return
        cause = health.cause(node.name)
        if not health.lost:  # should it still run them, they are no longer its to report
            try:
                await asyncio.wait_for(node.cancel(lost), _CALL_TIMEOUT_S)
            except Exception as exc:
                log.info("node %s: could not cancel its lost sessions: %s", node.name, exc)
        specs = await asyncio.to_thread(self.state.requeue, lost)
        healthy = self._healthy()
        log.warning("%s; %d unfinished sessions %s", cause, len(specs),
                    "requeued on " + ", ".join(n.name for n in healthy) if healthy else "failed: no healthy node")
        for spec in specs:
            self._owner.pop(spec.session_id, None)
            if healthy:
                await self._dispatch(spec)
        if not healthy:
            await self._fail(specs, f"{cause}; no healthy node to requeue it on", node.name)

    async def _fail(self, specs: list[SessionSpec], error: str, node: str | None) -> None:
        """End sessions that no node can run, with the cause as their result."""
        for spec in specs:
            result = SessionResult(session_id=spec.session_id, task_id=spec.task.id, sample=spec.sample,
                                   outcome="error", error=error, node=node)
            await asyncio.to_thread(self.state.put_result, result)
        await self._finished([spec.session_id for spec in specs])

    async def _finished(self, session_ids: list[str]) -> None:
        for session_id in session_ids:
            self._owner.pop(session_id, None)
        if session_ids:
            async with self._new_result:
                self._new_result.notify_all()

    def _persist(self, node: NodeHandle, events: list[tuple[str, Any]]) -> list[str]:
        if self._health[id(node)].lost:  # heard after it was lost: its sessions have moved
            if events:
                log.info("node %s: ignoring %d events from it, lost", node.name, len(events))
            return []
        finished = []
        for kind, payload in events:
            if kind == "stage":
                session_id, stage = payload
                if self._owner.get(session_id) is node:
                    self.state.set_stage(session_id, stage)
                continue
            result = payload if isinstance(payload, SessionResult) else SessionResult.model_validate(payload)
            owner = self._owner.get(result.session_id)
            if owner is not None and owner is not node:  # moved off this node when it was lost
                log.info("node %s: ignoring its result for %s, now run by %s", node.name, result.session_id,
                         owner.name)
                continue
            self.state.put_result(result)
            finished.append(result.session_id)
        return finished
