"""What `polar rollout status` shows of a node's fleet: each replica's state, load and vLLM metrics (scraped
from its /metrics when asked), and a warning line per replica out. The node is a real GatewayNode; its
gateway here is a stand-in holding a real FleetBackend on a loop of its own, as the embedded proxy holds it;
the replicas' endpoints are tests/support/weight_server.py (no /metrics: nothing scraped)."""

from __future__ import annotations

import asyncio
import threading
from types import SimpleNamespace

from polar.cli.rollout import unhealthy_lines
from polar.rollout.node import GatewayNode, NodeConfig
from polar.rollout.service import LocalNode
from polar.rollout.simulate import SimulatedPhases
from polar.upstream.fleet.backend import FleetBackend
from tests.support.weight_server import WeightServer


def test_rollout_status_carries_the_fleet_and_warns_of_a_replica_out():
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        with WeightServer() as one, WeightServer() as two:
            fleet = FleetBackend([(one.url, None), (two.url, None)])
            fleet.replicas[1].take_out("cannot connect to the upstream: refused")
            phases = SimulatedPhases(0.01)
            phases.env = SimpleNamespace(gateway=SimpleNamespace(
                addon=SimpleNamespace(gateway=SimpleNamespace(backend=fleet)), master=SimpleNamespace(event_loop=loop)))

            async def stats():
                node = LocalNode(GatewayNode(phases, NodeConfig()))
                try:
                    return await node.stats()
                finally:
                    await node.node.stop()

            stats = asyncio.run(stats())
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
    replicas = stats["fleet"]["replicas"]
    assert [r["url"] for r in replicas] == [one.url, two.url] and [r["up"] for r in replicas] == [True, False]
    assert replicas[0]["prefix_cache_hit_rate"] is None and replicas[1]["failures"] == 1
    assert set(stats["fleet"]["routing"]) == {"affinity", "prefix", "least-loaded", "moved"}
    status = {"nodes": [{**stats, "node": "local", "healthy": True}]}
    (line,) = unhealthy_lines(status)
    assert line.startswith(f"node local: upstream replica {two.url} out since ") and line.endswith("refused")
