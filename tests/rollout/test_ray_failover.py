"""Many Ray machines, one dies: a real multi-node Ray cluster on this machine (Ray's own `Cluster`: a
head and worker nodes, each its own raylet), node actors on every node, and one worker node killed
mid-run as a crashed machine would be (its raylet SIGKILLed, its actors with it).

The service must move the dead node's unfinished sessions to the survivors as soon as Ray declares
the node dead (Ray's failure detector, ~15 s by default), not after `node_grace` (60 s), and the
trainer must get every session's result exactly once. Run with `-s` to print the measured figures.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import time

import pytest

from polar.rollout.node import NodeConfig
from polar.rollout.service import RolloutService
from polar.rollout.state import RolloutState
from polar.rollout.tasks import Named, TaskSpec
from tests.rollout.conftest import ONE_CALL, ApiServer, first_results

ray = pytest.importorskip("ray")
pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]  # a cluster of raylets takes seconds to start

NODE_GRACE = 60.0  # the default: the moves below must come long before it


@pytest.fixture
def cluster():
    """`start(workers)`: a head and `workers` worker nodes, this process connected as the driver."""
    from ray.cluster_utils import Cluster

    started: list[Cluster] = []

    def start(workers: int):
        c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
        started.append(c)
        nodes = [c.add_node(num_cpus=1) for _ in range(workers)]
        ray.init(address=c.address, log_to_driver=False, configure_logging=False)
        c.wait_for_nodes()
        return c, nodes

    yield start
    ray.shutdown()
    for c in started:
        c.shutdown()


def _kill(cluster, raylet) -> float:
    """Kill a worker node as a crash would (no graceful shutdown); the wall time it happened."""
    killed_at = time.time()
    cluster.remove_node(raylet, allow_graceful=False)
    return killed_at


def _moved(caplog, victim: str) -> tuple[float, str]:
    """When the service requeued the dead node's sessions (wall time) and what it said."""
    (record,) = [r for r in caplog.records if r.getMessage().startswith(f"node {victim} lost since")]
    return record.created, record.getMessage()


def _attempts(state_path) -> dict[str, int]:
    """Sessions the service started again (attempt > 0), read from its state database."""
    conn = sqlite3.connect(state_path)
    try:
        rows = conn.execute("SELECT session_id, json_extract(spec, '$.attempt') FROM sessions").fetchall()
    finally:
        conn.close()
    return {session_id: attempt for session_id, attempt in rows if attempt}


def test_simulated_sessions_of_a_dead_machine_move_at_once_and_every_result_arrives_once(cluster, tmp_path, caplog):
    """Three machines, simulated sessions, the trainer on the HTTP API; one worker machine dies after
    it has reported some results and while it runs others."""
    from polar.rollout.client import RolloutClient
    from polar.rollout.ray_nodes import launch_nodes

    caplog.set_level(logging.INFO, logger="polar.rollout.service")
    c, (victim_raylet, _) = cluster(workers=2)
    nodes = launch_nodes(NodeConfig(name="sim", running_slots=2), {"kind": "simulated", "scale": 0.01},
                         resources={"num_cpus": 0.5})
    assert len(nodes) == 3 and len({n.node_id for n in nodes}) == 3  # one actor on each machine
    victim = next(n.name for n in nodes if n.node_id == victim_raylet.node_id)
    make = lambda: RolloutService(RolloutState(tmp_path / "r.db"), nodes, node_grace=NODE_GRACE)  # noqa: E731

    with ApiServer(tmp_path / "r.db", make=make) as server, RolloutClient(server.url) as client:
        # Each machine gets two of each: the short ones report, then the long ones (8 s) run.
        accepted = client.submit([TaskSpec(id="short", instruction="x", samples=6, metadata={"sim": {"run": 50}}),
                                  TaskSpec(id="long", instruction="x", samples=6, timeout=1000, metadata={"sim": {"run": 800}})])
        sessions = [s for a in accepted for s in a["sessions"]]
        stream = client.results(follow=True)  # acknowledges each result once the loop has it
        results = []
        while sum(r.node == victim for r in results) < 2:  # the victim has reported its short ones
            results.append(next(stream)[1])
        killed_at = _kill(c, victim_raylet)
        while len(results) < len(sessions):
            results.append(next(stream)[1])
        finished_at = time.time()
        stream.close()

        after = client.submit([TaskSpec(id="after", instruction="x", samples=4, metadata={"sim": {"run": 10}})])
        stream = client.results(follow=True)
        later = [next(stream)[1] for _ in range(4)]
        stream.close()
        time.sleep(1.0)  # room for anything late (or duplicated) to show up
        status = client.status()
        replay = [r for _, r in client.results(follow=False, ack=False, include_drained=True)]

    moved_at, said = _moved(caplog, victim)
    requeued = _attempts(tmp_path / "r.db")
    by_session = {r.session_id: r for r in results}
    print(f"\nfailover (simulated, 3 machines): kill -> requeue {moved_at - killed_at:.1f} s, "
          f"{len(requeued)} sessions requeued, {len(results)}/{len(sessions)} results once, "
          f"kill -> last result {finished_at - killed_at:.1f} s (node_grace {NODE_GRACE:.0f} s)")

    # Every session's result, exactly once, to the trainer; none from the dead machine after it died.
    assert sorted(by_session) == sorted(sessions) and len(results) == len(sessions)
    assert {r.outcome for r in results} == {"ok"}
    assert sorted(r.session_id for r in replay) == sorted(sessions + after[0]["sessions"])  # the state: once each
    assert sorted(r.session_id for r in results if r.node == victim) == sorted(
        s for s in by_session if s.startswith("short.") and by_session[s].node == victim)
    # The victim's two long sessions, unfinished when it died, ran again elsewhere as second attempts.
    assert len(requeued) == 2 and all(s.startswith("long.") for s in requeued) and set(requeued.values()) == {1}
    assert {by_session[s].node for s in requeued} <= {n.name for n in nodes} - {victim}
    assert f"2 unfinished sessions requeued on {', '.join(n.name for n in nodes if n.name != victim)}" in said

    # Moved as soon as Ray declared the machine dead, far inside the grace period.
    assert 0 < moved_at - killed_at < NODE_GRACE / 2, said
    assert finished_at - killed_at < NODE_GRACE / 2 + 10

    # The dead machine is shown lost and never used again.
    assert status["lost_nodes"] == [victim] and status["unhealthy_nodes"] == [victim]
    lost = next(n for n in status["nodes"] if n["node"] == victim)
    assert lost["lost"] and lost["last_error"].startswith(f"NodeLost: actor {victim}: ")
    assert {r.outcome for r in later} == {"ok"} and victim not in {r.node for r in later}
    assert status["outcomes"] == {"ok": len(sessions) + 4}


def _calls(db) -> list[dict]:
    """Every call row of a capture database, token columns decoded (a corrupt one would raise)."""
    from polar.capture.reader import CaptureReader

    return list(CaptureReader(db).calls(with_tokens=True))


def _integrity(db) -> str:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return conn.execute("PRAGMA integrity_check").fetchone()[0]
    finally:
        conn.close()


def test_gateway_sessions_of_a_dead_machine_finish_elsewhere_and_its_captures_survive(
        cluster, double_server, tokenizer_dir, tmp_path, caplog):
    """Two machines, each a gateway actor (its own polar, capturing into its own database) running
    sessions that make real model calls a few seconds apart; the worker machine dies between them."""
    from polar.rollout.ray_nodes import launch_nodes

    caplog.set_level(logging.INFO, logger="polar.rollout.service")
    c, (victim_raylet,) = cluster(workers=1)
    _, upstream = double_server
    phases = {"kind": "gateway", "upstream": upstream, "db": str(tmp_path / "captures.db"),
              "tokenizer": str(tokenizer_dir)}
    nodes = launch_nodes(NodeConfig(name="gw"), phases, resources={"num_cpus": 0.5})
    victim = next(n.name for n in nodes if n.node_id == victim_raylet.node_id)
    survivor = next(n.name for n in nodes if n.name != victim)
    victim_db, survivor_db = tmp_path / f"captures-{victim}.db", tmp_path / f"captures-{survivor}.db"
    script = f"{ONE_CALL} && sleep 4 && {ONE_CALL}"  # two calls: the machine dies in between

    async def main():
        service = RolloutService(RolloutState(tmp_path / "r.db"), nodes, node_grace=NODE_GRACE)
        await service.start()
        try:
            (accepted,) = await service.submit([TaskSpec(id="real", instruction="x", samples=4, timeout=120,
                                                         harness=Named(name="shell", options={"script": script}))])
            async with asyncio.timeout(90):  # until the victim's two sessions each committed their first call
                while len({r["session_id"] for r in (_calls(victim_db) if victim_db.exists() else [])
                           if r["status"] == "ok"}) < 2:
                    await asyncio.sleep(0.2)
            before = _calls(victim_db)
            killed_at = await asyncio.to_thread(_kill, c, victim_raylet)
            results = await first_results(service, 4, timeout=120)
            finished_at = time.time()
            await asyncio.sleep(1.0)  # room for anything late (or duplicated)
            return accepted, before, killed_at, finished_at, results, await service.status()
        finally:
            await service.close()

    accepted, before, killed_at, finished_at, results, status = asyncio.run(main())
    moved_at, said = _moved(caplog, victim)
    requeued = _attempts(tmp_path / "r.db")
    print(f"\nfailover (gateway, 2 machines): kill -> requeue {moved_at - killed_at:.1f} s, "
          f"{len(requeued)} sessions requeued, {len(results)}/4 results once, "
          f"kill -> last result {finished_at - killed_at:.1f} s; dead machine's database: "
          f"{len(_calls(victim_db))} calls kept, integrity {_integrity(victim_db)}")

    # Every session's result, once, with its trajectory; the dead machine's two ran again on the survivor.
    assert sorted(r.session_id for r in results) == sorted(accepted["sessions"])
    assert [(r.outcome, r.reward) for r in results] == [("ok", 1.0)] * 4, results
    assert all(r.trajectories and all(t.trainable_tokens for t in r.trajectories) for r in results)
    assert len(requeued) == 2 and set(requeued.values()) == {1}
    assert {r.node for r in results if r.session_id in requeued} == {survivor}
    assert f"2 unfinished sessions requeued on {survivor}" in said and 0 < moved_at - killed_at < NODE_GRACE / 2
    assert status["lost_nodes"] == [victim]
    assert len(RolloutState(tmp_path / "r.db").all_results()) == 4

    # Nothing the dead machine committed is lost: its database is whole and holds every call it had.
    assert _integrity(victim_db) == "ok"
    kept = _calls(victim_db)
    kept_by_id = {r["call_id"]: r for r in kept}
    assert before and all(r["call_id"] in kept_by_id for r in before)  # every call it had is still there
    assert all(kept_by_id[r["call_id"]]["completion_ids"] == r["completion_ids"] for r in before if r["status"] == "ok")
    first_calls = [r for r in kept if r["session_id"] in requeued and r["status"] == "ok"]
    assert sorted(r["session_id"] for r in first_calls) == sorted(requeued)  # first attempts' calls, attempt 0 ids
    assert all(r["completion_ids"] and r["prompt_ids"] for r in first_calls)
    # The second attempts captured on the survivor, under their own capture ids.
    again = [r for r in _calls(survivor_db) if r["session_id"] in {f"{s}.r1" for s in requeued}]
    assert sorted(r["session_id"] for r in again if r["status"] == "ok") == sorted(
        f"{s}.r1" for s in requeued for _ in range(2))
