"""RolloutClient.update_policy: polar's gate and vLLM's reload in one update (stand-in vLLM); simulated
sessions, and a real one through the in-process polar whose version reaches the capture, the trajectory and
the exported rows as the same int."""

from __future__ import annotations

import dataclasses

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from polar.capture.reader import CaptureReader
from polar.cli.export import export
from polar.datasets.rl import group_sizes, stream_rl_groups
from polar.rollout.client import RolloutClient
from polar.rollout.lifecycle import SessionPhases
from polar.rollout.node import GatewayNode, NodeConfig
from polar.rollout.service import LocalNode, RolloutService
from polar.rollout.state import RolloutState
from polar.rollout.tasks import TaskSpec, load_tasks
from polar.upstream.vllm_weights import VLLMWeights, WeightSyncError
from tests.rollout.conftest import TASKS, ApiServer
from tests.support.weight_server import WeightServer

FIX = {"name": "edit_file", "arguments": {"path": "calc.py", "old": "(len(values) + 1)", "new": "len(values)"}}


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


def test_the_policy_version_is_the_same_int_from_update_policy_to_the_exported_rows(stack, node_env, tmp_path,
                                                                                    checkpoint):
    stack.script(rules=[{"match": "calc.py", "steps": [{"tool_calls": [FIX]}, {"content": "Fixed."}]}])
    task = load_tasks(TASKS / "tasks.jsonl")[0].model_copy(update={"samples": 1})  # calc-mean
    env = dataclasses.replace(node_env, gateway=stack.proxy)  # the gate stamps the version on every call
    config, state = NodeConfig(), tmp_path / "rollout.db"

    def make():
        node = LocalNode(GatewayNode(SessionPhases(env, config), config), env.capture_db)
        return RolloutService(RolloutState(state), [node])

    try:
        with (ApiServer(state, make=make) as server, RolloutClient(server.url) as client,
              WeightServer() as fake, VLLMWeights(fake.url) as vllm):
            assert client.update_policy(vllm, checkpoint, 3)["policy_version"] == 3
            group = next(stream_rl_groups(client, group_sizes(client.submit([task]))))
    finally:
        stack.proxy.resume_sampling()  # (opened by the update already)
        stack.proxy.addon.gate.policy_version = None  # the shared stack's later tests see no version
    (result,) = RolloutState(state).all_results()
    assert (result.outcome, result.reward, result.policy_version) == ("ok", 1.0, 3), result
    rows = list(CaptureReader(env.capture_db).calls(session=result.session_id))
    assert [r["policy_version"] for r in rows] == [3, 3]
    # The label the upstream reports for its weights is kept apart (the double's, as vLLM's before a trainer named
    # them: its placeholder)
    assert [r["weight_version"] for r in rows] == ["default", "default"]
    (trajectory,) = result.trajectories
    assert trajectory.policy_version == 3 and [t.policy_version for t in trajectory.turns] == [3, 3]
    (rl_row,) = group.rows
    assert (rl_row["policy_version"], rl_row["trainer_policy_version"]) == (3, 3)

    out = tmp_path / "dataset"
    done = CliRunner().invoke(export, ["--state", str(state), "--captures", env.capture_db, "--out", str(out),
                                       "--val-fraction", "0", "--format", "parquet", "--rl"])
    assert done.exit_code == 0, done.output
    (token_row,) = pq.read_table(out / "tokens" / "train.parquet").to_pylist()
    assert (token_row["policy_version"], token_row["trainer_policy_version"]) == (3, 3)
    assert [t["policy_version"] for t in token_row["turns"]] == [3, 3]
    assert pq.read_schema(out / "tokens" / "train.parquet").field("policy_version").type == "int64"
