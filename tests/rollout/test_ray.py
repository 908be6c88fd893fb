"""Several gateway node actors on a local Ray cluster, dispatched by the rollout service."""

from __future__ import annotations

import asyncio

import pytest

from polar.rollout.node import NodeConfig
from polar.rollout.service import RolloutService
from polar.rollout.state import RolloutState
from polar.rollout.tasks import TaskSpec
from tests.rollout.conftest import ONE_CALL, first_results

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.slow  # a local Ray cluster takes seconds to start


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield
    ray.shutdown()


def test_service_spreads_a_group_over_node_actors(local_ray, tmp_path):
    from polar.rollout.ray_nodes import launch_nodes

    async def main():
        nodes = launch_nodes(NodeConfig(name="ray", running_slots=2), {"kind": "simulated", "scale": 0.01},
                             resources={"num_cpus": 1}, per_node=3)
        service = RolloutService(RolloutState(tmp_path / "r.db"), nodes)
        await service.start()
        try:
            await service.resume(policy_version=2)
            task = TaskSpec(id="grp", instruction="x", samples=9, metadata={"sim": {"run": 5, "reward": 1.0}})
            (accepted,) = await service.submit([task])
            results = await first_results(service, 9, timeout=60)
            return accepted, results, await service.status()
        finally:
            await service.close()

    accepted, results, status = asyncio.run(main())
    assert sorted(r.session_id for r in results) == sorted(accepted["sessions"])
    assert {r.outcome for r in results} == {"ok"} and {r.policy_version for r in results} == {2}
    assert len({r.node for r in results}) == 3  # every actor ran part of the group
    assert len(status["nodes"]) == 3 and all(n["ray_node"] for n in status["nodes"])


def test_real_sessions_on_a_gateway_node_actor(local_ray, double_server, tokenizer_dir, tmp_path):
    """The actor embeds its own polar and local runtime and captures into its own database."""
    from polar.capture.reader import CaptureReader
    from polar.rollout.ray_nodes import launch_nodes
    from polar.rollout.tasks import Named

    _, upstream = double_server
    phases = {"kind": "gateway", "upstream": upstream, "db": str(tmp_path / "captures.db"),
              "tokenizer": str(tokenizer_dir)}

    async def main():
        (node,) = launch_nodes(NodeConfig(name="gw"), phases)
        service = RolloutService(RolloutState(tmp_path / "r.db"), [node])
        await service.start()
        try:
            task = TaskSpec(id="ray-real", instruction="x", samples=2,
                            harness=Named(name="shell", options={"script": ONE_CALL}))
            await service.submit([task])
            return await first_results(service, 2, timeout=90)
        finally:
            await service.close()

    results = asyncio.run(main())
    assert [(r.outcome, r.reward) for r in results] == [("ok", 1.0)] * 2, results
    assert all(len(r.trajectories) == 1 and r.trajectories[0].trainable_tokens for r in results)
    (db,) = tmp_path.glob("captures-gw-*.db")  # named after the actor
    captured = list(CaptureReader(db).calls(with_tokens=False))
    assert sorted(row["session_id"] for row in captured) == sorted(r.session_id for r in results)


@pytest.mark.slow
def test_cli_serves_with_ray_node_actors(tmp_path):
    """`polar rollout serve --ray local`: the CLI path starts node actors and serves results."""
    import socket
    import subprocess
    import sys
    import time

    from polar.mitm.proxy import free_port
    from polar.rollout.client import RolloutClient
    from polar.rollout.tasks import TaskSpec

    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "polar.cli", "rollout", "serve", "--ray", "local", "--simulate", "0.01",
         "--port", str(port), "--state", str(tmp_path / "rollout.db")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.time() + 120
        while True:
            assert server.poll() is None, server.stdout.read()
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.time() < deadline, "the rollout server did not start"
                time.sleep(0.5)
        client = RolloutClient(f"http://127.0.0.1:{port}")
        client.submit([TaskSpec(id="ray-cli", instruction="x", samples=3, metadata={"sim": {"run": 1}})])
        got = []
        for _, result in client.results():
            got.append(result)
            if len(got) == 3:
                break
        assert {r.outcome for r in got} == {"ok"} and all(r.node for r in got)
    finally:
        server.terminate()
        server.wait(timeout=60)
