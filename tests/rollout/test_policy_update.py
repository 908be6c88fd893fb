"""RolloutClient.update_policy: polar's gate and vLLM's reload in one update (simulated sessions, stand-in vLLM)."""

from __future__ import annotations

import pytest

from polar.rollout.client import RolloutClient
from polar.rollout.tasks import TaskSpec
from polar.upstream.vllm_weights import VLLMWeights, WeightSyncError
from tests.rollout.conftest import ApiServer
from tests.support.weight_server import WeightServer


def sim_task(task_id: str, policy_version: int | None = None) -> TaskSpec:
    return TaskSpec(id=task_id, instruction="x", timeout=100, policy_version=policy_version,
                    metadata={"sim": {"run": 1, "reward": 1.0}})


def results_of(client: RolloutClient, n: int) -> dict[str, object]:
    got = {}
    for _, result in client.results(follow=True):
        got[result.task_id] = result
        if len(got) == n:
            return got
    return got


@pytest.fixture
def checkpoint(tmp_path):
    out = tmp_path / "v0001"
    out.mkdir()
    (out / "model.safetensors").write_bytes(b"weights")
    return out


def test_an_update_bumps_the_version_sessions_run_under_and_the_bound_refuses_older_ones(tmp_path, checkpoint):
    with (ApiServer(tmp_path / "r.db", max_staleness=1) as server, RolloutClient(server.url) as client,
          WeightServer() as fake, VLLMWeights(fake.url) as vllm):
        client.resume(policy_version=0)
        update = client.update_policy(vllm, checkpoint, 1)
        assert update["policy_version"] == 1 and update["undrained_calls"] == 0
        assert fake.names[0] == "POST /pause" and fake.names[-1] == "POST /resume" and fake.version == "1"
        client.update_policy(vllm, checkpoint, 2)
        status = client.status()
        assert status["policy_version"] == 2 and not status["paused"]

        client.submit([sim_task("now"), sim_task("one-behind", policy_version=1), sim_task("two-behind", 0)])
        got = results_of(client, 3)
        assert got["now"].outcome == "ok" and got["now"].policy_version == 2
        assert got["one-behind"].outcome == "ok"  # within the bound (1)
        assert got["two-behind"].outcome == "stale" and "policy version 0, now 2" in got["two-behind"].error


def test_a_failed_load_keeps_the_rollout_paused(tmp_path, checkpoint):
    with (ApiServer(tmp_path / "r.db") as server, RolloutClient(server.url) as client,
          WeightServer(fail="/collective_rpc") as fake, VLLMWeights(fake.url) as vllm):
        client.resume(policy_version=0)
        with pytest.raises(WeightSyncError, match="left paused"):
            client.update_policy(vllm, checkpoint, 1)
        status = client.status()
        assert status["paused"] and status["policy_version"] == 0  # nothing samples from half-loaded weights
        assert fake.paused
