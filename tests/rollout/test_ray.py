"""Several gateway node actors on a local Ray cluster, dispatched by the rollout service."""

from __future__ import annotations

import asyncio
import json

import pytest

from polar.rollout.node import NodeConfig
from polar.rollout.service import RolloutService
from polar.rollout.state import RolloutState
from polar.rollout.tasks import TaskSpec
from tests.rollout.conftest import ONE_CALL, first_results

# One model call whose prompt no other session shares (the same prompt would follow its prefix to one replica).
OWN_PROMPT_CALL = ("{python} -c \"import openai, uuid; openai.OpenAI(max_retries=0).chat.completions.create("
                   "model='m', messages=[{'role': 'user', 'content': 'hello ' + uuid.uuid4().hex}])\"")

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


def test_rollout_status_shows_every_node_actor_s_fleet(local_ray, double_server, tokenizer_dir, tmp_path):
    """`polar rollout status` on a server whose nodes are Ray actors: each actor's gateway routes over its own
    fleet of the same two upstream replicas (scripted vLLM doubles, TEST DOUBLES; one a process of its own),
    and reports it as the embedded node does — per replica in or out, calls, failures. Once that process is
    killed, a node whose fleet took it out (its calls failed over: its own capture rows say so) warns of it."""
    from click.testing import CliRunner

    from polar.capture.reader import CaptureReader
    from polar.cli.rollout import status as status_command
    from polar.rollout.client import RolloutClient
    from polar.rollout.ray_nodes import launch_nodes
    from polar.rollout.tasks import Named
    from tests.rollout.conftest import ApiServer
    from tests.support.replicas import DoubleProcess

    other = DoubleProcess(tokenizer_dir)
    other.launch()
    other.wait_ready()
    urls = [double_server[1], other.url]
    phases = {"kind": "gateway", "upstream": ",".join(urls), "db": str(tmp_path / "captures.db"),
              "tokenizer": str(tokenizer_dir)}

    nodes = launch_nodes(NodeConfig(name="fleet", running_slots=1), phases, per_node=2)
    ray.get([node.actor.stats.remote() for node in nodes], timeout=120)  # each builds its gateway: seconds

    def make():
        return RolloutService(RolloutState(tmp_path / "r.db"), nodes)

    def task(name: str, samples: int) -> TaskSpec:  # each session its own prompt: routing spreads them
        return TaskSpec(id=name, instruction="x", samples=samples,
                        harness=Named(name="shell", options={"script": OWN_PROMPT_CALL}))

    def status() -> tuple[dict, list[str]]:
        out = CliRunner().invoke(status_command, ["--server", server.url])
        assert out.exit_code == 0, out.output
        return json.loads(out.stdout), [line for line in out.stderr.splitlines() if "upstream replica" in line]

    def run(client, name: str, samples: int) -> None:
        client.submit([task(name, samples)])
        stream = client.results(follow=True)  # acknowledges each result: the next run's stream starts after them
        got = [next(stream)[1] for _ in range(samples)]
        stream.close()
        assert [r.outcome for r in got] == ["ok"] * samples, got

    try:
        with ApiServer(tmp_path / "r.db", make=make) as server, RolloutClient(server.url) as client:
            run(client, "before", 4)
            before, warnings = status()
            other.kill()
            run(client, "after", 6)  # each node's new sessions go to the replica holding fewer: the dead one too
            after, warnings_after = status()
    finally:
        other.kill()
    assert len(before["nodes"]) == 2 and not warnings
    for node in before["nodes"]:
        replicas = node["fleet"]["replicas"]
        assert [r["url"] for r in replicas] == urls and all(r["up"] for r in replicas), node
        assert all(r["in_flight"] == 0 and r["failures"] == 0 for r in replicas)
    assert [sum(n["fleet"]["replicas"][i]["calls"] for n in before["nodes"]) for i in (0, 1)] == [2, 2]
    out_on = {n["node"] for n in after["nodes"] if not n["fleet"]["replicas"][1]["up"]}
    assert out_on and all(n["fleet"]["replicas"][0]["up"] for n in after["nodes"]), after["nodes"]
    assert sorted(warnings_after) == sorted(f"warning: node {name}: upstream replica {other.url} out since "
                                            f"{n['fleet']['replicas'][1]['out_since']}: "
                                            f"{n['fleet']['replicas'][1]['last_error']}"
                                            for n in after["nodes"] if (name := n["node"]) in out_on)
    for node in after["nodes"]:  # each node's view matches its own captures
        (db,) = tmp_path.glob(f"captures-{node['node']}.db")
        rows = list(CaptureReader(db).calls(with_tokens=False))
        failed_over = [r for r in rows if r["result"] and r["result"].get("failovers")]
        # A failed-over call counts on the dead replica too, unless the refusal came before it was counted there.
        assert len(rows) <= sum(r["calls"] for r in node["fleet"]["replicas"]) <= len(rows) + len(failed_over)
        assert bool(failed_over) == (node["node"] in out_on)
        assert all(r["status"] == "ok" and r["replica"] == urls[0] for r in failed_over)
    # `polar report` reads every node's database as one run: each replica's share over all the nodes.
    from polar.cli.report import report

    dbs = sorted(tmp_path.glob("captures-fleet-*.db"))
    out = CliRunner().invoke(report, [a for db in dbs for a in ("--db", str(db))] + ["--out", str(tmp_path / "r.html")])
    assert out.exit_code == 0 and "10 sessions" in out.output, out.output
    html = (tmp_path / "r.html").read_text()
    assert "Fleet replicas" in html and all(url in html for url in urls)
    from polar.reporting import gather

    rows = [r for db in dbs for r in CaptureReader(db).calls(with_tokens=False)]
    by_url = {r.replica: r for r in gather(captures=dbs).replicas}
    assert len(rows) == sum(r.calls for r in by_url.values()) == sum(r.ok for r in by_url.values()) == 10
    assert by_url[other.url].calls == 2  # one session of each node before the kill
    assert by_url[other.url].failed_over == sum(1 for r in rows if r["result"].get("failovers"))
