"""Pool scheduling with simulated sessions: buffer bounds, deadlines, crashes, staleness, pause, cancel."""

from __future__ import annotations

import asyncio

import pytest

from polar.rollout.node import GatewayNode, HarnessRun, NodeConfig
from polar.rollout.simulate import SimulatedPhases
from polar.rollout.tasks import SessionSpec, TaskSpec

SCALE = 0.01  # 1 simulated second = 10 ms


def sessions(n: int = 1, timeout: float = 100, **sim) -> list[SessionSpec]:
    return SessionSpec.expand(TaskSpec(instruction="x", samples=n, timeout=timeout, metadata={"sim": sim}))


async def collect(node: GatewayNode, n: int, timeout: float = 10) -> list:
    results, stages = [], []
    async with asyncio.timeout(timeout):
        while len(results) < n:
            for kind, payload in await node.next_events(0.5):
                (results if kind == "result" else stages).append(payload)
    return results


def run(coro):
    return asyncio.run(coro)


class Watched(SimulatedPhases):
    """Records how full the READY buffer and the RUNNING slots get."""

    def __init__(self, node_ref: list, **kw):
        super().__init__(**kw)
        self.node_ref, self.max_ready, self.max_running = node_ref, 0, 0

    async def run(self, spec, timeout):
        node = self.node_ref[0]
        self.max_ready = max(self.max_ready, node.stats()["ready"])
        self.max_running = max(self.max_running, node.running)
        return await super().run(spec, timeout)


def test_pools_respect_slots_and_the_bounded_ready_buffer():
    async def main():
        ref: list = []
        phases = Watched(ref, scale=SCALE)
        node = GatewayNode(phases, NodeConfig(init_workers=3, ready_size=2, running_slots=2, postrun_workers=1))
        ref.append(node)
        node.start()
        for spec in sessions(12, init=0.5, run=3, postrun=1):
            node.submit(spec)
        results = await collect(node, 12)
        await node.stop()
        return phases, results, node

    phases, results, node = run(main())
    assert sorted(r.outcome for r in results) == ["ok"] * 12
    assert phases.max_running <= 2 and 1 <= phases.max_ready <= 2
    assert all(set(r.timings) == {"init", "run", "postrun"} for r in results)
    assert node.stats()["stages"] == {}


def test_timeout_crashes_and_the_rest_of_the_group():
    async def main():
        node = GatewayNode(SimulatedPhases(scale=SCALE), NodeConfig(running_slots=2))
        node.start()
        specs = sessions(2, timeout=5, run=1) + sessions(1, timeout=5, run=50)
        specs += sessions(1, init=0.1, fail="init") + sessions(1, postrun=0.1, fail="postrun")
        for spec in specs:
            node.submit(spec)
        results = await collect(node, len(specs))
        await node.stop()
        return {r.session_id: r for r in results}, specs

    by_id, specs = run(main())
    outcomes = [by_id[s.session_id] for s in specs]
    assert [r.outcome for r in outcomes] == ["ok", "ok", "timeout", "error", "error"]
    assert outcomes[2].partial
    assert outcomes[3].error.startswith("init: RuntimeError: simulated init crash")
    assert outcomes[4].error.startswith("postrun: RuntimeError: simulated postrun crash")


class Hanging(SimulatedPhases):
    async def run(self, spec, timeout):
        await asyncio.sleep(3600)  # a runtime that fails to kill its harness
        return HarnessRun(exit_code=0)


def test_node_stops_waiting_for_a_harness_its_runtime_cannot_kill():
    async def main():
        node = GatewayNode(Hanging(scale=SCALE), NodeConfig(kill_grace=0.05))
        node.start()
        node.submit(sessions(timeout=0.05)[0])
        (result,) = await collect(node, 1)
        await node.stop()
        return result

    result = run(main())
    assert result.outcome == "timeout" and result.partial


def test_stale_sessions_are_refused_and_results_carry_the_policy_version():
    async def main():
        node = GatewayNode(SimulatedPhases(scale=SCALE), NodeConfig(max_staleness=1))
        node.set_policy_version(5)
        node.start()
        old = SessionSpec.expand(TaskSpec(instruction="x", policy_version=3))[0]
        recent = SessionSpec.expand(TaskSpec(instruction="x", policy_version=4))[0]
        node.submit(old)
        node.submit(recent)
        results = {r.session_id: r for r in await collect(node, 2)}
        await node.stop()
        return results[old.session_id], results[recent.session_id]

    old, recent = run(main())
    assert old.outcome == "stale" and "policy version 3, now 5" in old.error
    assert recent.outcome == "ok" and recent.policy_version == 5


def test_pause_holds_new_sessions_and_resume_sets_the_version():
    async def main():
        node = GatewayNode(SimulatedPhases(scale=SCALE), NodeConfig(running_slots=1))
        node.start()
        node.pause()
        node.submit(sessions(run=0.1)[0])
        await asyncio.sleep(0.2)
        held = node.stats()
        node.resume(policy_version=7)
        (result,) = await collect(node, 1)
        await node.stop()
        return held, result

    held, result = run(main())
    assert held["paused"] and held["stages"] == {"ready": 1} and held["running"] == 0
    assert result.outcome == "ok" and result.policy_version == 7


def test_pool_sizes_must_be_positive():
    with pytest.raises(ValueError, match="running_slots must be at least 1"):
        NodeConfig(running_slots=0)


def test_cancelled_sessions_do_not_run():
    async def main():
        node = GatewayNode(SimulatedPhases(scale=SCALE), NodeConfig(running_slots=1, ready_size=1))
        node.start()
        specs = sessions(4, run=1)
        for spec in specs:
            node.submit(spec)
        node.cancel([s.session_id for s in specs[2:]])
        results = {r.session_id: r.outcome for r in await collect(node, 4)}
        await node.stop()
        return [results[s.session_id] for s in specs]

    assert run(main()) == ["ok", "ok", "cancelled", "cancelled"]
