"""One policy version across a fleet: the trainer updates every replica (FleetWeights), the gateway's fleet
resumes only on replicas serving the new version and takes one back once it does. The replicas' dev-mode
endpoints are tests/support/weight_server.py (a stand-in checked against vLLM 0.32's routes); the sampling
backends behind them are in-process doubles that record where each call went."""

from __future__ import annotations

import asyncio

import pytest

from polar.canonical import ChatRequest, ChatResult, Message, TextPart
from polar.gateway.gate import SamplingGate
from polar.sessions.state import SessionState, SessionView
from polar.upstream.fleet.backend import FleetBackend
from polar.upstream.fleet.weights import FleetWeights
from polar.upstream.vllm_weights import WeightSyncError
from tests.support.weight_server import WeightServer


class Sampler:
    """A TEST DOUBLE backend: answers at once, counting its calls."""

    def __init__(self):
        self.calls = 0

    async def complete(self, request, call_id, session=None) -> ChatResult:
        self.calls += 1
        return ChatResult(id=call_id, model="m", created=0, content="ok")

    def template_traits(self):
        return None

    async def aclose(self) -> None:
        pass


def _weights(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"\0")
    return tmp_path


def test_every_replica_takes_the_new_weights_and_a_failed_one_is_named(tmp_path):
    with WeightServer() as good, WeightServer(fail="/collective_rpc") as bad, \
            FleetWeights([good.url, bad.url]) as fleet:
        loaded = fleet.load(_weights(tmp_path), 3)
        assert set(loaded.replicas) == {good.url} and bad.url in loaded.failed and "reload" in loaded.failed[bad.url]
        assert good.version == "3" and not good.paused
        assert bad.paused and bad.version == "default"  # left as VLLMWeights leaves a failed update
        assert loaded.seconds["reload"] >= 0 and fleet.versions() == {good.url: "3", bad.url: "default"}
    with WeightServer(fail="/collective_rpc") as bad, FleetWeights([bad.url]) as fleet, \
            pytest.raises(WeightSyncError, match="no replica of the fleet took policy version 4"):
        fleet.load(_weights(tmp_path), 4)


def test_sampling_resumes_only_on_replicas_serving_the_new_version_and_a_fixed_one_comes_back(tmp_path):
    async def scenario(good: WeightServer, bad: WeightServer) -> None:
        samplers = [Sampler(), Sampler()]
        fleet = FleetBackend([(good.url, samplers[0]), (bad.url, samplers[1])], probe_interval=0.1)
        gate = SamplingGate()
        gate.before_resume = fleet.adopt_version
        gate.pause()
        good.version = "5"  # the trainer's update reached one replica only
        gate.resume(5)
        assert not gate._open.is_set()  # not before every replica was asked
        async with asyncio.timeout(10):
            async with gate.sampling():
                pass
        assert [r.up for r in fleet.replicas] == [True, False]
        assert "serves weight version default" in fleet.replicas[1].last_error
        for n in range(6):
            request = ChatRequest(model="m", messages=[Message(role="user", content=[TextPart(text=f"task {n}")])])
            result = await fleet.complete(request, f"c{n}", SessionView(SessionState(), [], f"s{n}"))
            assert result.replica == good.url
        assert samplers[1].calls == 0
        await asyncio.sleep(0.5)
        assert not fleet.replicas[1].up  # it answers, but not with the fleet's version
        bad.version = "5"
        for _ in range(100):
            await asyncio.sleep(0.05)
            if fleet.replicas[1].up:
                break
        assert fleet.replicas[1].up and fleet.replicas[1].weight_version == "5"
        assert fleet.status()["replicas"][1]["readmitted"] == 1
        await fleet.aclose()

    with WeightServer() as good, WeightServer() as bad:
        asyncio.run(scenario(good, bad))


def test_a_resume_cut_short_by_a_pause_checks_again_before_opening():
    async def scenario() -> None:
        checks: list[int] = []
        release = asyncio.Event()

        async def check(version: int) -> None:
            checks.append(version)
            await release.wait()

        gate = SamplingGate()
        gate.before_resume = check
        gate.pause()
        gate.resume(6)
        await asyncio.sleep(0.05)
        gate.pause()  # the trainer changed its mind while the fleet was being asked
        gate.resume(6)
        await asyncio.sleep(0.05)
        assert checks == [6, 6] and not gate._open.is_set()
        release.set()
        async with asyncio.timeout(5):
            async with gate.sampling():
                pass
        gate.pause()
        gate.resume(6)  # checked already: opens at once
        assert gate._open.is_set() and checks == [6, 6]

    asyncio.run(scenario())


def test_the_gate_takes_the_trainers_step_as_an_int_only():
    async def scenario() -> None:
        gate = SamplingGate()
        gate.pause()
        for label in ("5", "step-42", 5.0, True):  # a label of the weights is no step: vLLM's goes to weight_version
            with pytest.raises(TypeError, match="the trainer's step, an int"):
                gate.resume(label)
        assert not gate._open.is_set() and gate.policy_version is None
        gate.resume(5)
        assert gate._open.is_set() and gate.policy_version == 5

    asyncio.run(scenario())
