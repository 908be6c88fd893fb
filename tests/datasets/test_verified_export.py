"""`polar export --verification FILE [--drop-unverified]`: rows carry each trajectory's verdict, statistics
count them, and only trajectories verified within tolerance go out when asked."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
from click.testing import CliRunner

from polar.cli import main
from polar.datasets.source import RolloutSource
from tests.datasets.test_cli import rollout_state
from tests.verify.crafted import results_file


def run(*args):
    return CliRunner().invoke(main, ["export", *map(str, args)], catch_exceptions=False)


def trajectories(state):
    source = RolloutSource(state)
    try:
        return {t.id: t for rec in source.records() for t in rec.result.trajectories}
    finally:
        source.close()


def test_rows_carry_the_verdict_and_unverified_ones_can_be_left_out(tmp_path):
    state = rollout_state(tmp_path / "rollout.db", {"a": [1.0, 0.0], "b": [1.0, 0.5], "c": [1.0]})
    found = trajectories(state)
    assert sorted(found) == ["a.0#0", "a.1#0", "b.0#0", "b.1#0", "c.0#0"]
    results = results_file(tmp_path / "verify.jsonl", list(found.values()), fail={"a.1#0"}, stale={"b.0#0"},
                           skip={"c.0#0"})
    out = tmp_path / "all"
    done = run("--state", state, "--out", out, "--val-fraction", 0, "--quiet", "--rl", "--format", "parquet",
               "--verification", results)
    assert done.exit_code == 0, done.output
    assert "verification: 2 verified, 1 failed, 1 stale, 1 not verified of 5" in " ".join(done.output.split())
    stats = json.loads((out / "stats.json").read_text())
    assert stats["verification"] | {"file": None} == {
        "file": None, "records": 4, "trajectories": 5, "verified": 2, "failed": 1, "stale": 1, "not_verified": 1,
        "max_abs_diff": 10.0, "tolerances": [3.0]}
    rows = {r["trajectory_id"]: r for r in pq.read_table(out / "tokens" / "train.parquet").to_pylist()}
    assert {k: r["verification"] for k, r in rows.items()} == {
        "a.0#0": "verified", "a.1#0": "failed", "b.0#0": "stale", "b.1#0": "verified", "c.0#0": "not verified"}
    assert rows["a.1#0"]["verify_max_abs_diff"] == 10.0 and rows["b.0#0"]["verify_max_abs_diff"] is None
    rl = {r["trajectory_id"]: r["verification"] for r in pq.read_table(out / "rl" / "groups.parquet").to_pylist()}
    assert rl == {k: r["verification"] for k, r in rows.items()}

    kept = tmp_path / "kept"
    done = run("--state", state, "--out", kept, "--val-fraction", 0, "--quiet", "--rl", "--format", "parquet",
               "--verification", results, "--drop-unverified")
    assert done.exit_code == 0, done.output
    stats = json.loads((kept / "stats.json").read_text())
    assert stats["rejected"] == {"failed verification": 1, "stale verification": 1, "not verified": 1}
    assert sorted(r["trajectory_id"] for r in pq.read_table(kept / "tokens" / "train.parquet").to_pylist()) == [
        "a.0#0", "b.1#0"]
    assert stats["rl"]["rows"] == 2 and stats["rl"]["rows_left_out_unverified"] == 3
    group_a = [r for r in pq.read_table(kept / "rl" / "groups.parquet").to_pylist() if r["group_id"] == "a"]
    assert [(r["trajectory_id"], r["group_reward_mean"]) for r in group_a] == [("a.0#0", 0.5)]  # still over both


def test_dropping_unverified_needs_a_file_and_a_bad_file_is_named(tmp_path):
    state = rollout_state(tmp_path / "rollout.db", {"a": [1.0]})
    done = run("--state", state, "--out", tmp_path / "o", "--drop-unverified")
    assert done.exit_code == 2 and "--drop-unverified needs --verification" in done.output
    bad = tmp_path / "bad.jsonl"
    bad.write_text("not json\n")
    done = run("--state", state, "--out", tmp_path / "o", "--verification", bad)
    assert done.exit_code == 1 and "bad.jsonl:1 is not JSON" in done.output
