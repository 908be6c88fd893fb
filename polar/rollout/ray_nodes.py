"""Gateway nodes as Ray actors: one per machine of a Ray cluster, dispatched by the same service.

Each actor runs a `GatewayNode` on its own event loop, with its own embedded polar (one proxy per
process, which an actor is) and local runtime, capturing into a database on its machine; the
rollout server talks to it only through `RayNode`, the `NodeHandle` over actor calls. Ray does the
placement (one actor per alive node, pinned there, with the resources it declares) and the
transport: there is no cluster protocol of polar's own.

A machine that dies takes its actor with it for good (pinned there, never restarted): once Ray says
so, `RayNode` raises `NodeLost` and the service moves the node's sessions at once. Until then
(Ray's failure detector takes ~15 s by default) its errors are transient ones, retried and graced.

`phases` picks what the node runs: {"kind": "gateway", "upstream": url, "db": path, …} for real
sessions (add "docker": true for the docker runtime, "allow_open_egress": true to run it without
its host-port lock), {"kind": "simulated", "scale": s} for dry
runs and tests.
"""

from __future__ import annotations

import asyncio
from dataclasses import asdict
from pathlib import Path
from typing import Any

import ray
from ray.exceptions import ActorDiedError, RayActorError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from polar.rollout.node import GatewayNode, NodeConfig
from polar.rollout.service import NodeLost, fleet_view, pending_calls, with_fleet
from polar.rollout.tasks import SessionResult, SessionSpec


@ray.remote
class NodeActor:
    def __init__(self, config: dict[str, Any], phases: dict[str, Any]):
        self.config = NodeConfig(**config)
        self.phases_spec = phases
        self.proxy = None
        self.capture_db: str | None = None
        self.node: GatewayNode | None = None
        self.runtimes: list = []

    def _build(self) -> GatewayNode:
        spec = dict(self.phases_spec)
        kind = spec.pop("kind")
        if kind == "simulated":
            from polar.rollout.simulate import SimulatedPhases

            phases = SimulatedPhases(**spec)
        elif kind == "gateway":
            from polar.rollout.lifecycle import SessionPhases, embedded_gateway

            # Each actor owns its capture database: the store allocates row ids in-process.
            db = Path(spec["db"])
            self.capture_db = str(db.with_name(f"{db.stem}-{self.config.name}{db.suffix}"))
            self.proxy, env = embedded_gateway(spec["upstream"], self.capture_db, spec.get("port", 0),
                                               spec.get("upstream_model", ""), spec.get("tokenizer", ""),
                                               spec.get("docker", False), spec.get("allow_open_egress"),
                                               spec.get("upstream_stall", 0))
            self.runtimes = list(env.runtimes.values())
            phases = SessionPhases(env, self.config)
        else:
            raise ValueError(f"unknown node phases {kind!r} (gateway or simulated)")
        node = GatewayNode(phases, self.config)
        node.start()
        return node

    async def _node(self) -> GatewayNode:
        if self.node is None:  # built on the actor's event loop, where the pools must live
            self.node = self._build()
        return self.node

    async def submit(self, spec: dict[str, Any]) -> None:
        (await self._node()).submit(SessionSpec.model_validate(spec))

    async def cancel(self, session_ids: list[str]) -> None:
        (await self._node()).cancel(session_ids)

    async def pause(self) -> None:
        (await self._node()).pause()

    async def resume(self, policy_version: int | None) -> None:
        (await self._node()).resume(policy_version)

    async def in_flight_calls(self) -> int:
        return pending_calls(self.capture_db)

    async def events(self, timeout: float) -> list[tuple[str, Any]]:
        events = await (await self._node()).next_events(timeout)
        return [(kind, p.model_dump(mode="json") if isinstance(p, SessionResult) else p) for kind, p in events]

    async def stats(self) -> dict[str, Any]:
        """The node's stats, its Ray machine, and its gateway's fleet of replicas (as the local node's)."""
        stats = {**(await self._node()).stats(), "ray_node": ray.get_runtime_context().get_node_id()}
        return with_fleet(stats, await fleet_view(self.proxy))

    async def close(self) -> None:
        if self.node is not None:
            await self.node.stop()
            close = getattr(self.node.phases, "close", None)
            if close:
                close()
        for runtime in self.runtimes:
            runtime.close()
        if self.proxy is not None:
            self.proxy.stop()


class RayNode:
    """The service's handle on one `NodeActor`, pinned to the Ray machine `node_id`."""

    def __init__(self, actor: Any, name: str, node_id: str | None = None):
        self.actor = actor
        self.name = name
        self.node_id = node_id

    async def _call(self, ref: Any) -> Any:
        try:
            return await ref
        except RayActorError as exc:
            if await self._gone(exc):  # Ray's messages run to many lines: the first says what happened
                raise NodeLost(": ".join([f"actor {self.name}", type(exc).__name__, *str(exc).splitlines()[:1]])) from exc
            raise

    async def _gone(self, exc: RayActorError) -> bool:
        """Dead for good: Ray says the actor died (it is never restarted), or its machine left the cluster."""
        if isinstance(exc, ActorDiedError):
            return True
        if self.node_id is None:
            return False
        nodes = await asyncio.to_thread(ray.nodes)  # the cluster's view, from its control store
        return not any(n["NodeID"] == self.node_id and n["Alive"] for n in nodes)

    async def submit(self, spec: SessionSpec) -> None:
        await self._call(self.actor.submit.remote(spec.model_dump(mode="json")))

    async def cancel(self, session_ids: list[str]) -> None:
        await self._call(self.actor.cancel.remote(session_ids))

    async def pause(self) -> None:
        await self._call(self.actor.pause.remote())

    async def resume(self, policy_version: int | None) -> None:
        await self._call(self.actor.resume.remote(policy_version))

    async def in_flight_calls(self) -> int:
        return await self._call(self.actor.in_flight_calls.remote())

    async def events(self, timeout: float) -> list[tuple[str, Any]]:
        return await self._call(self.actor.events.remote(timeout))

    async def stats(self) -> dict[str, Any]:
        return await self._call(self.actor.stats.remote())

    async def close(self) -> None:
        try:
            await self.actor.close.remote()
        finally:
            ray.kill(self.actor)


def launch_nodes(config: NodeConfig, phases: dict[str, Any], resources: dict[str, float] | None = None,
                 per_node: int = 1) -> list[RayNode]:
    """`per_node` node actors on every alive machine of the connected Ray cluster, pinned there.

    `resources` is what each actor declares (e.g. {"num_cpus": 4} or {"resources": {"sandbox_slots": 8}}),
    so Ray refuses to place a node where it does not fit rather than oversubscribing the machine.
    """
    declared = {"num_cpus": 1, **(resources or {})}
    handles = []
    for machine in (n for n in ray.nodes() if n["Alive"]):
        for i in range(per_node):
            name = f"{config.name}-{machine['NodeID'][:8]}-{i}"
            actor = NodeActor.options(
                name=name, **declared,
                scheduling_strategy=NodeAffinitySchedulingStrategy(machine["NodeID"], soft=False),
            ).remote(asdict(NodeConfig(**{**asdict(config), "name": name})), phases)
            handles.append(RayNode(actor, name, machine["NodeID"]))
    return handles
