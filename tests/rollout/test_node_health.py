"""A node whose event stream fails: logged, backed off, shown unhealthy, its sessions moved or failed.

The failing node is a DOUBLE: a real `GatewayNode` on simulated phases whose `events()` raises while
`deaf` is set, as a Ray actor's stream does when its machine drops off the network. Its sessions
keep running; the service just cannot hear their results.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time

from click.testing import CliRunner

from polar.cli.rollout import progress_table
from polar.cli.rollout import status as status_command
from polar.rollout.client import RolloutClient
from polar.rollout.health import NodeHealth
from polar.rollout.node import GatewayNode, NodeConfig
from polar.rollout.service import LocalNode, NodeLost, RolloutService
from polar.rollout.simulate import SimulatedPhases
from polar.rollout.state import RolloutState
from polar.rollout.tasks import TaskSpec
from tests.rollout.conftest import ApiServer, first_results

SCALE = 0.01  # 1 simulated second = 10 ms


class DeafNode(LocalNode):
    """A node double: its event stream raises while `deaf` is set."""

    def __init__(self, name: str, deaf: bool = False):
        super().__init__(GatewayNode(SimulatedPhases(SCALE), NodeConfig(name=name, running_slots=4)))
        self.deaf = deaf

    async def events(self, timeout: float):
        if self.deaf:
            await asyncio.sleep(0.01)
            raise ConnectionError(f"{self.name}: event stream broke")
        return await super().events(timeout)

    async def cancel(self, session_ids: list[str]) -> None:
        if self.deaf:
            raise ConnectionError(f"{self.name}: unreachable")
        await super().cancel(session_ids)


class DyingNode(LocalNode):
    """A node double that dies for good when `dead` is set: every call raises `NodeLost`, as a Ray
    actor's does once its machine is gone. Its simulated sessions run on, unheard. With `late`, its
    event stream answers only once a session has a result, so the call under way when it dies answers
    after: a report heard from a node already lost."""

    def __init__(self, name: str, late: bool = False):
        super().__init__(GatewayNode(SimulatedPhases(SCALE), NodeConfig(name=name, running_slots=4)))
        self.dead = False
        self.late = late
        self.calls_after_death = 0

    async def _check(self) -> None:
        if self.dead:
            self.calls_after_death += 1
            raise NodeLost(f"{self.name}: actor died")

    async def events(self, timeout: float):
        if self.late:
            heard: list = []
            while not any(kind == "result" for kind, _ in heard):
                heard += await super().events(timeout)
            return heard
        await self._check()
        return await super().events(timeout)

    async def submit(self, spec) -> None:
        await self._check()
        await super().submit(spec)


def _task(task_id: str, samples: int, run: float) -> TaskSpec:
    return TaskSpec(id=task_id, instruction="x", samples=samples, timeout=1000, metadata={"sim": {"run": run}})


def _wait_for(predicate, timeout: float = 10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(0.05)
    raise AssertionError("condition not met in time")


def test_backoff_doubles_up_to_its_cap_and_recovery_resets_it():
    health = NodeHealth(backoff=0.5, backoff_cap=4.0)
    assert [health.failed(OSError("down")) for _ in range(6)] == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]
    assert not health.healthy and health.as_dict()["last_error"] == "OSError: down" and health.since
    assert health.recovered() == 6 and health.healthy and health.as_dict()["unhealthy_since"] is None
    assert health.failed(OSError("again")) == 0.5


def test_a_lost_node_is_shown_unhealthy_and_its_sessions_finish_elsewhere(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="polar.rollout.service")
    nodes: dict[str, DeafNode] = {}

    def make() -> RolloutService:  # on the server's loop
        nodes.update(lost=DeafNode("lost"), good=DeafNode("good"))
        return RolloutService(RolloutState(tmp_path / "r.db"), [nodes["lost"], nodes["good"]], node_grace=0.3,
                              backoff_cap=0.2)

    with ApiServer(tmp_path / "r.db", make=make) as server, RolloutClient(server.url) as client:
        (accepted,) = client.submit([_task("t", 4, run=100)])  # 1 s each: two sessions per node
        nodes["lost"].deaf = True

        printed = _wait_for(lambda: (out := CliRunner().invoke(status_command, ["--server", server.url]))
                            and "unhealthy" in out.stderr and out)
        status = json.loads(printed.stdout)
        lost = next(n for n in status["nodes"] if n["node"] == "lost")
        assert status["unhealthy_nodes"] == ["lost"] and not lost["healthy"] and lost["failures"] >= 1
        assert lost["last_error"] == "ConnectionError: lost: event stream broke" and lost["unhealthy_since"]
        assert "node lost unhealthy since" in printed.stderr and "event stream broke" in printed.stderr
        assert "node lost unhealthy since" in progress_table(status, [], 4, 1.0).caption  # `polar submit`'s view

        stream = client.results(follow=True)
        results = [next(stream)[1] for _ in range(4)]
        stream.close()
        assert sorted(r.session_id for r in results) == sorted(accepted["sessions"])
        assert {(r.outcome, r.node) for r in results} == {("ok", "good")}

        nodes["lost"].deaf = False  # its stream recovers: healthy again, its stale reports ignored
        status = _wait_for(lambda: (s := client.status()) and not s["unhealthy_nodes"] and s)
        lost = next(n for n in status["nodes"] if n["node"] == "lost")
        assert lost["healthy"] and lost["last_error"].endswith("event stream broke")
        time.sleep(0.3)
        assert client.status()["outcomes"] == {"ok": 4}

    failures = [r for r in caplog.records if "event stream failed" in r.getMessage()]
    assert failures and failures[0].exc_info and isinstance(failures[0].exc_info[1], ConnectionError)
    assert "event stream broke" in failures[0].getMessage()
    assert any("2 unfinished sessions requeued on good" in r.getMessage() for r in caplog.records)
    assert any("node lost: event stream recovered" in r.getMessage() for r in caplog.records)
    specs = {s.session_id: s for s in RolloutState(tmp_path / "r.db").unfinished()}
    assert specs == {}  # every session ended


def test_with_no_healthy_node_the_sessions_fail_with_the_cause(tmp_path):
    async def main():
        node = DeafNode("only")
        service = RolloutService(RolloutState(tmp_path / "r.db"), [node], node_grace=0.3, backoff_cap=0.2)
        await service.start()
        try:
            await service.submit([_task("t", 2, run=1)])
            node.deaf = True
            return await first_results(service, 2, timeout=10)
        finally:
            await service.close()

    results = asyncio.run(main())
    for result in results:
        assert result.outcome == "error" and result.node == "only"
        assert "node only unhealthy since" in result.error and "event stream broke" in result.error
        assert result.error.endswith("no healthy node to requeue it on")


def test_cancelling_past_an_unhealthy_node_reaches_the_sessions_it_loses(tmp_path):
    async def main():
        lost, good = DeafNode("lost"), DeafNode("good")
        service = RolloutService(RolloutState(tmp_path / "r.db"), [lost, good], node_grace=0.3, backoff_cap=0.2)
        await service.start()
        try:
            await service.submit([_task("t", 4, run=1000)])  # 10 s each, two per node
            lost.deaf = True
            assert await service.cancel("t") == 4
            return await first_results(service, 4, timeout=10)
        finally:
            await service.close()

    results = asyncio.run(main())
    assert {(r.outcome, r.node) for r in results} == {("cancelled", "good")}


def test_a_node_lost_for_good_moves_its_sessions_at_once_and_is_never_used_again(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="polar.rollout.service")

    async def main():
        dead, good = DyingNode("dead"), DyingNode("good")
        service = RolloutService(RolloutState(tmp_path / "r.db"), [dead, good], node_grace=60)
        await service.start()
        try:
            (first,) = await service.submit([_task("t", 4, run=100)])  # 1 s each: two sessions per node
            await asyncio.sleep(0.2)
            dead.dead, killed = True, time.monotonic()
            await first_results(service, 4, timeout=10)
            moved_in = time.monotonic() - killed
            (second,) = await service.submit([_task("after", 3, run=1)])  # all on the survivor
            results = await first_results(service, 7, timeout=10)
            calls = dead.calls_after_death
            await asyncio.sleep(1.2)  # the dead node's own runs end meanwhile: never heard
            return first, second, results, moved_in, calls, dead.calls_after_death, await service.status()
        finally:
            await service.close()

    first, second, results, moved_in, calls, calls_later, status = asyncio.run(main())
    assert moved_in < 3.0  # no 60 s grace: the two moved sessions restart at once and run their 1 s
    assert sorted(r.session_id for r in results) == sorted(first["sessions"] + second["sessions"])  # each once
    assert {(r.outcome, r.node) for r in results} == {("ok", "good")}
    assert calls == calls_later == 1  # one failed call, then never asked again
    assert status["lost_nodes"] == ["dead"] and status["unhealthy_nodes"] == ["dead"]
    lost = next(n for n in status["nodes"] if n["node"] == "dead")
    assert lost["lost"] and not lost["healthy"] and lost["last_error"] == "NodeLost: dead: actor died"
    assert "stats_error" not in lost and "running" not in lost  # a lost node is not asked for its stats
    assert status["outcomes"] == {"ok": 7}
    assert any("node dead lost for good" in r.getMessage() for r in caplog.records)
    assert any("node dead lost since" in r.getMessage() and "2 unfinished sessions requeued on good"
               in r.getMessage() for r in caplog.records)
    assert [s.attempt for s in RolloutState(tmp_path / "r.db").unfinished()] == []


def test_with_every_node_lost_new_sessions_fail_at_once(tmp_path):
    async def main():
        node = DyingNode("only")
        service = RolloutService(RolloutState(tmp_path / "r.db"), [node], node_grace=60)
        await service.start()
        try:
            await service.submit([_task("t", 2, run=100)])
            node.dead = True
            await first_results(service, 2, timeout=10)
            await service.submit([_task("late", 1, run=1)])
            return await first_results(service, 3, timeout=10)
        finally:
            await service.close()

    results = asyncio.run(main())
    assert [r.outcome for r in results] == ["error"] * 3
    assert all(r.error.startswith("node only lost since") and r.error.endswith("no healthy node to requeue it on")
               for r in results[:2])
    assert results[2].error == "no node left: every node is lost" and results[2].node is None


def test_what_a_lost_node_says_after_it_was_lost_is_ignored(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="polar.rollout.service")

    async def main():
        dying, good = DyingNode("dying", late=True), DyingNode("good")
        service = RolloutService(RolloutState(tmp_path / "r.db"), [dying, good], node_grace=60)
        await service.start()
        try:
            (first,) = await service.submit([_task("t", 2, run=100)])  # one on each node
            await asyncio.sleep(0.2)  # the service is waiting on `dying`'s stream
            dying.dead = True
            (second,) = await service.submit([_task("u", 1, run=1)])  # tried on `dying` first: lost there
            results = await first_results(service, 3, timeout=10)
            await asyncio.sleep(1.5)  # `dying` finishes its own run of t meanwhile, and reports it: too late
            return first, second, results, await service.status()
        finally:
            await service.close()

    first, second, results, status = asyncio.run(main())
    assert sorted(r.session_id for r in results) == sorted(first["sessions"] + second["sessions"])
    assert {(r.outcome, r.node) for r in results} == {("ok", "good")}
    assert status["outcomes"] == {"ok": 3} and status["lost_nodes"] == ["dying"]
    ignored = [r.getMessage() for r in caplog.records if "node dying: ignoring" in r.getMessage()]
    assert len(ignored) == 1 and ignored[0].endswith("events from it, lost")
    assert len(RolloutState(tmp_path / "r.db").all_results()) == 3
