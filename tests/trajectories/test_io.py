"""Trajectory files (JSONL, Parquet), the format's own checks, and the `polar trajectories` command."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from pydantic import ValidationError

from polar.cli.trajectories import trajectories as trajectories_cmd
from polar.trajectories import Trajectory, prefix_merge
from polar.trajectories.io import read, read_jsonl, read_parquet, write, write_jsonl, write_parquet
from tests.trajectories.crafted import conversation

SYSTEM = list(range(100, 140))


def _session(recorder) -> list[Trajectory]:
    """A main line, a fork, a broken prefix and a failed tail: every optional field gets a value."""
    p1 = SYSTEM + [248045, 1]
    recorder.call("s", p1, [11, 12, 248046], conversation("t ü", 0), policy=3)
    recorder.call("s", p1 + [11, 12, 248046, 5], [13, 248046], conversation("t ü", 1), finish="length", policy=3)
    recorder.call("s", p1 + [11, 12, 248046, 6], [14, 248046], conversation("t ü", 1))  # fork
    recorder.call("s", p1 + [11, 99, 248046, 5, 13, 248046, 7], [15, 248046], conversation("t ü", 2))  # break
    recorder.fail("s", conversation("t ü", 3))
    trajs = prefix_merge(recorder.rows())
    trajs[0].reward, trajs[0].task = 1.0, "task-7"
    trajs[1].step_rewards = [0.5]
    return trajs


def test_session_fixture_covers_the_optional_fields(recorder):
    main, fork, broken = _session(recorder)
    assert fork.lineage and broken.prefix_break and broken.partial and main.truncated and main.policy_version == 3


def test_jsonl_round_trip(recorder, tmp_path):
    trajs = _session(recorder)
    assert write_jsonl(trajs, tmp_path / "t.jsonl") == 3
    assert list(read_jsonl(tmp_path / "t.jsonl")) == trajs
    first = json.loads((tmp_path / "t.jsonl").read_text().splitlines()[0])
    assert first["task"] == "task-7" and first["loss_mask"][-3:] == [0, 1, 1]


def test_parquet_round_trip(recorder, tmp_path):
    trajs = _session(recorder)
    assert write_parquet(trajs, tmp_path / "t.parquet") == 3
    assert list(read_parquet(tmp_path / "t.parquet")) == trajs


def test_parquet_reads_with_pyarrow_alone(recorder, tmp_path):
    trajs = _session(recorder)
    write_parquet(trajs, tmp_path / "t.parquet")
    table = pq.read_table(tmp_path / "t.parquet")
    assert table.schema.field("token_ids").type == pa.list_(pa.int32())
    assert table.schema.field("loss_mask").type == pa.list_(pa.int8())
    assert table.schema.field("logprobs").type == pa.list_(pa.float32())
    rows = table.to_pylist()
    assert [r["token_ids"] for r in rows] == [t.token_ids for t in trajs]
    assert rows[1]["lineage"]["fork_position"] == trajs[1].lineage.fork_position
    assert rows[2]["prefix_break"]["expected_id"] == 12 and rows[2]["failed_row_ids"] == trajs[2].failed_row_ids
    assert rows[0]["turns"][1]["finish_reason"] == "length" and json.loads(rows[0]["metadata"])["model"] == "test-model"
    # logprobs arrive from the store as float32: nothing is lost in the column
    assert rows[0]["logprobs"] == trajs[0].logprobs


def test_policy_versions_are_ints_in_the_files_and_older_labels_read_as_none(recorder, tmp_path):
    main = _session(recorder)[0]
    write_parquet([main], tmp_path / "t.parquet")
    (row,) = pq.read_table(tmp_path / "t.parquet").to_pylist()
    assert row["policy_version"] == 3 and [t["policy_version"] for t in row["turns"]] == [3, 3]
    assert pq.read_schema(tmp_path / "t.parquet").field("policy_version").type == pa.int64()
    # As a rollout state stored it before policy_version was an int: the step's digits, or vLLM's label
    stored = json.loads(main.model_dump_json())
    stored["policy_version"], stored["turns"][0]["policy_version"], stored["turns"][1]["policy_version"] = (
        "3", "3", "default")
    old = Trajectory.model_validate(stored)
    assert old.policy_version == 3 and [t.policy_version for t in old.turns] == [3, None]


def test_a_parquet_file_with_text_policy_versions_still_reads(recorder, tmp_path):
    """Files written while policy_version was text (the step's digits, or vLLM's label) read as before."""
    main = _session(recorder)[0]
    write_parquet([main], tmp_path / "t.parquet")
    table = pq.read_table(tmp_path / "t.parquet")
    rows = table.to_pylist()
    rows[0]["policy_version"] = "3"
    rows[0]["turns"][0]["policy_version"], rows[0]["turns"][1]["policy_version"] = "3", "default"
    old_schema = pa.schema([f.with_type(pa.string()) if f.name == "policy_version" else f for f in table.schema])
    turns = old_schema.field("turns").type.value_type
    old_turn = pa.struct([f.with_type(pa.string()) if f.name == "policy_version" else f for f in turns])
    old_schema = old_schema.set(old_schema.get_field_index("turns"), pa.field("turns", pa.list_(old_turn)))
    pq.write_table(pa.Table.from_pylist(rows, schema=old_schema), tmp_path / "old.parquet")
    (read,) = read_parquet(tmp_path / "old.parquet")
    assert read.policy_version == 3 and [t.policy_version for t in read.turns] == [3, None]
    assert read.token_ids == main.token_ids and read.logprobs == main.logprobs


def test_missing_logprobs_round_trip_as_nulls(recorder, tmp_path):
    p1 = SYSTEM + [1]
    recorder.call("s", p1, [11, 2], conversation("t", 0))
    recorder.call("s", p1 + [11, 2, 3], [12, 2], conversation("t", 1), no_logprobs=True)
    (traj,) = prefix_merge(recorder.rows())
    assert traj.logprobs[-2:] == [None, None] and not traj.has_logprobs
    for name in ("t.jsonl", "t.parquet"):
        write([traj], tmp_path / name)
        (back,) = read(tmp_path / name)
        assert back == traj and back.logprobs[-2:] == [None, None] and not back.has_logprobs
    assert json.loads((tmp_path / "t.jsonl").read_text())["logprobs"][-2:] == [None, None]
    (row,) = pq.read_table(tmp_path / "t.parquet").to_pylist()
    assert row["logprobs"][-2:] == [None, None] and row["logprobs"][-5:-3] == traj.logprobs[-5:-3]
    assert [t["has_logprobs"] for t in row["turns"]] == [True, False]


def test_write_and_read_by_suffix(recorder, tmp_path):
    trajs = _session(recorder)
    for name in ("a.jsonl", "a.parquet"):
        write(trajs, tmp_path / name)
        assert list(read(tmp_path / name)) == trajs
    with pytest.raises(ValueError, match=".jsonl or .parquet"):
        write(trajs, tmp_path / "a.csv")


def test_format_rejects_misaligned_arrays():
    base = {"id": "x", "builder": "per-request", "session_id": "s", "token_ids": [1, 2], "loss_mask": [0, 1],
            "logprobs": [0.0, -0.1], "turns": []}
    assert Trajectory(**base).trainable_tokens == 1
    with pytest.raises(ValidationError, match="differ in length"):
        Trajectory(**{**base, "loss_mask": [0]})
    with pytest.raises(ValidationError, match="step_rewards"):
        Trajectory(**{**base, "step_rewards": [1.0]})


# -- the command -------------------------------------------------------------------------------------


def test_cli_builds_writes_and_reports(recorder, tmp_path):
    _session(recorder)
    recorder.close()
    db, out = str(recorder.path), tmp_path / "out" / "traj"
    out.parent.mkdir()
    runner = CliRunner()
    result = runner.invoke(trajectories_cmd, ["--db", db, "--out", str(out), "--format", "both", "--drift",
                                              "--drift-json", str(tmp_path / "drift.json")])
    assert result.exit_code == 0, result.output
    assert "1 sessions, 5 calls (4 sampled, 1 failed), 3 prefix-merge trajectories" in result.output
    assert "prefix breaks" in result.output
    assert len(list(read(out.with_suffix(".jsonl")))) == 3 and len(list(read(out.with_suffix(".parquet")))) == 3
    (drift,) = json.loads((tmp_path / "drift.json").read_text())
    assert drift["session_id"] == "s" and len(drift["breaks"]) == 1 and drift["not_ok"] == {"error": 1}

    result = runner.invoke(trajectories_cmd, ["--db", db, "--builder", "per-request", "--out", str(tmp_path / "p.jsonl")])
    assert result.exit_code == 0 and "4 per-request trajectories, 9 trainable tokens" in result.output
    assert len(list(read(tmp_path / "p.jsonl"))) == 4

    result = runner.invoke(trajectories_cmd, ["--db", db, "--session", "nobody"])
    assert result.exit_code == 0 and "0 sessions, 0 calls" in result.output


def test_cli_rejects_an_unknown_output_type(recorder, tmp_path):
    recorder.close()
    result = CliRunner().invoke(trajectories_cmd, ["--db", str(recorder.path), "--out", str(tmp_path / "t.csv")])
    assert result.exit_code == 2 and ".jsonl or .parquet" in result.output
