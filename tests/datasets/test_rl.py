"""RL batch rows: group statistics and advantages, and groups pulled live from a rollout server."""

from __future__ import annotations

import pyarrow as pa
import pytest

from polar.datasets.rl import SCHEMA, group_sizes, rl_group, rl_groups, stream_rl_groups
from polar.rollout.client import RolloutClient
from polar.rollout.tasks import TaskSpec
from tests.datasets.crafted import result
from tests.rollout.conftest import ApiServer


def test_advantages_are_per_session_and_group_normalised():
    # sample 1 split into three trajectories: it still counts once in the group's statistics
    rs = [result("t", 0, 1.0), result("t", 1, 0.0, extra=2), result("t", 2, 1.0), result("t", 3, 0.0),
          result("t", 4, None), result("t", 5, 1.0, outcome="error")]
    group = rl_group("t", rs, harness_of=lambda s: "codex")
    assert (group.sessions, group.reward_mean, group.reward_std) == (4, 0.5, 0.5)
    assert group.dropped == {"no reward": 1, "session error": 1}
    assert [(r["sample"], r["advantage"]) for r in group.rows] == [
        (0, pytest.approx(1.0, abs=1e-5)), (1, pytest.approx(-1.0, abs=1e-5)), (1, pytest.approx(-1.0, abs=1e-5)),
        (1, pytest.approx(-1.0, abs=1e-5)), (2, pytest.approx(1.0, abs=1e-5)), (3, pytest.approx(-1.0, abs=1e-5))]
    row = group.rows[0]
    assert row["group_id"] == "t" and row["group_size"] == 4 and row["harness"] == "codex"
    assert len(row["input_ids"]) == len(row["loss_mask"]) == len(row["logprobs"]) and sum(row["loss_mask"]) == 2
    assert group.has_signal
    pa.Table.from_pylist(group.rows, schema=SCHEMA)  # the documented schema holds every row

    centred = rl_group("t", rs, scale_by_std=False)
    assert [r["advantage"] for r in centred.rows][:2] == [0.5, -0.5]


def test_uniform_and_empty_groups():
    same = rl_group("t", [result("t", 0, 1.0), result("t", 1, 1.0)])
    assert not same.has_signal and {r["advantage"] for r in same.rows} == {0.0}
    empty = rl_group("t", [result("t", 0, outcome="cancelled")])
    assert (empty.rows, empty.sessions, empty.reward_mean) == ([], 0, None)
    timeout = rl_group("t", [result("t", 0, 0.0, outcome="timeout"), result("t", 1, 1.0)])
    assert timeout.sessions == 2  # a timed-out session is a scored attempt
    groups = rl_groups([result("a", 0), result("b", 0), result("a", 1)])
    assert [(g.group_id, g.sessions) for g in groups] == [("a", 2), ("b", 1)]


def sim_task(task_id: str, samples: int, reward: float) -> TaskSpec:
    return TaskSpec(id=task_id, instruction="x", samples=samples, timeout=100,
                    metadata={"sim": {"run": 1, "reward": reward}})


def test_groups_stream_from_the_rollout_server_once_complete(tmp_path):
    with ApiServer(tmp_path / "r.db", running_slots=4) as server, RolloutClient(server.url) as client:
        accepted = client.submit([sim_task("g1", 3, 0.5), sim_task("g2", 2, 1.0), sim_task("other", 1, 0.0)])
        sizes = group_sizes(accepted)
        assert sizes == {"g1": 3, "g2": 2, "other": 1}
        del sizes["other"]  # not ours: its result stays for another consumer
        stream = stream_rl_groups(client, sizes)
        first = next(stream)
        assert first.group_id in ("g1", "g2") and sum(first.dropped.values()) == sizes[first.group_id]
        assert len(first.session_ids) == sizes[first.group_id]

        def undrained() -> set[str]:
            return {r.session_id for _, r in client.results(follow=False, ack=False)}

        assert set(first.session_ids) <= undrained()  # not acknowledged while the consumer holds the group
        second = next(stream)
        assert {first.group_id, second.group_id} == {"g1", "g2"}
        assert not set(first.session_ids) & undrained()  # acknowledged once the consumer asked for more
        stream.close()
        assert set(second.session_ids) <= undrained()
        client.ack(second.seqs)
        assert not set(first.session_ids + second.session_ids) & undrained()
        # simulated sessions carry no trajectories: scored, but nothing to train on
        assert second.rows == [] and second.dropped == {"no trainable tokens": sizes[second.group_id]}
