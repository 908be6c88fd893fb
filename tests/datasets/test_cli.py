"""`polar export` on a hand-built rollout state: files, statistics, and clear errors for bad input."""

from __future__ import annotations

import json
import sqlite3

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from polar.cli import main
from polar.datasets import tokens
from polar.rollout.state import RolloutState
from polar.rollout.tasks import TaskSpec
from polar.trajectories import prefix_merge
from tests.datasets.crafted import result
from tests.support.captures import Recorder
from tests.trajectories.crafted import conversation


def rollout_state(path, rewards: dict[str, list[float]]):
    """A rollout state whose tasks' sessions finished with these rewards."""
    state = RolloutState(path)
    try:
        for task_id, values in rewards.items():
            specs = state.add_task(TaskSpec(id=task_id, instruction="x", samples=len(values)))
            for spec, reward in zip(specs, values):
                r = result(task_id, spec.sample, reward)
                state.put_result(r.model_copy(update={"session_id": spec.session_id}))
    finally:
        state.close()
    return path


def run(*args):
    return CliRunner().invoke(main, ["export", *map(str, args)], catch_exceptions=False)


def test_token_rows_splits_and_statistics_without_captures(tmp_path):
    state = rollout_state(tmp_path / "rollout.db", {"a": [1.0, 0.0], "b": [1.0, 1.0], "c": [0.5]})
    out = tmp_path / "out"
    done = run("--state", state, "--out", out, "--min-reward", 1.0, "--val-fraction", 0.3, "--quiet", "--rl")
    assert done.exit_code == 0, done.output
    assert "3/5 trajectories accepted from 5 sessions" in done.output
    assert "2 reward below threshold" in done.output and "export: by task" in done.output
    stats = json.loads((out / "stats.json").read_text())
    assert stats["total"]["accepted"] == 3 and stats["rejected"] == {"reward below threshold": 2}
    assert stats["by_harness"] == {"python-agent": {"attempted": 5, "accepted": 3, "tokens": 15, "trainable_tokens": 6,
                                                    "turns": 3, "trajectories_without_logprobs": 0,
                                                    "turns_without_logprobs": 0, "mean_reward": 1.0}}
    assert "chat" not in stats and not (out / "chat").exists()  # chat rows need --captures
    assert stats["rl"] == {"groups": 3, "rows": 5, "groups_with_signal": 1, "dropped_sessions": {}}

    from datasets import load_dataset

    splits = {s: load_dataset("parquet", data_files=str(out / "tokens" / f"{s}.parquet"), split="train",
                              cache_dir=str(tmp_path / "hf"))
              for s in ("train", "validation")}
    as_json = load_dataset("json", data_files=str(out / "tokens" / "train.jsonl"), split="train",
                           features=tokens.features(), cache_dir=str(tmp_path / "hf"))
    assert as_json.to_list() == splits["train"].to_list()
    tasks = {s: {row["task"] for row in ds} for s, ds in splits.items()}
    assert tasks["train"] and tasks["validation"] and not tasks["train"] & tasks["validation"]
    for row in splits["train"]:
        assert row["labels"] == [t if m else -100 for t, m in zip(row["input_ids"], row["loss_mask"])]
        assert row["harness"] == "python-agent" and row["reward"] == 1.0

    # a second export into the same directory leaves nothing of the first behind
    done = run("--state", state, "--out", out, "--val-fraction", 0, "--format", "jsonl", "--quiet")
    assert done.exit_code == 0, done.output
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*.*")) == ["stats.json", "tokens/train.jsonl"]


def test_bad_input_is_a_clear_error(tmp_path):
    state = rollout_state(tmp_path / "rollout.db", {"a": [1.0]})
    out = tmp_path / "out"

    missing = run("--state", tmp_path / "nope.db", "--out", out)
    assert missing.exit_code == 1 and "no rollout state database at" in missing.output
    assert not (tmp_path / "nope.db").exists()  # nothing created on the way

    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"not a database at all" * 100)
    bad = run("--state", garbage, "--out", out)
    assert bad.exit_code == 1 and "is not an SQLite database" in bad.output

    other = tmp_path / "other.db"
    sqlite3.connect(other).execute("CREATE TABLE calls (id INTEGER)").connection.commit()
    wrong = run("--state", other, "--out", out)
    assert wrong.exit_code == 1 and "is not a polar rollout state database (missing: results(" in wrong.output
    swapped = run("--state", state, "--captures", state, "--out", out)
    assert swapped.exit_code == 1 and "is not a polar capture database; it is a rollout state database" \
        in swapped.output

    a_file = tmp_path / "file"
    a_file.write_text("x")
    assert "is a file" in run("--state", state, "--out", a_file).output  # click says so
    fmt = run("--state", state, "--out", out, "--format", "jsonl,csv")
    assert fmt.exit_code == 2 and "use a comma-separated list of jsonl, parquet" in fmt.output
    assert run("--state", state, "--out", out, "--val-fraction", 1).exit_code == 2
    template = run("--state", state, "--out", out, "--chat-template", state)
    assert template.exit_code == 2 and "--chat-template needs --tokenizer" in template.output
    assert not out.exists()


@pytest.mark.parametrize("script", [True, False], ids=["scripts/export_dataset.py", "polar export"])
def test_help_names_the_options(script):
    import subprocess
    import sys

    from tests.conftest import REPO

    argv = [sys.executable, str(REPO / "scripts" / "export_dataset.py")] if script else \
        [sys.executable, "-m", "polar.cli", "export"]
    done = subprocess.run([*argv, "--help"], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert done.returncode == 0, done.stderr
    for option in ("--state", "--captures", "--out", "--min-reward", "--val-fraction", "--format", "--tokenizer"):
        assert option in done.stdout


def test_missing_logprobs_export_as_nulls_never_zeros(tmp_path):
    """A call whose upstream gave no logprobs, among normal ones: its span is null in the token and RL
    rows (read back with pyarrow and with datasets), the rows say has_logprobs false, stats count it."""
    state = RolloutState(tmp_path / "rollout.db")
    recorder = Recorder(tmp_path / "captures.db")
    try:
        for task_id, rewards in {"a": [1.0, 0.0], "b": [1.0]}.items():
            for spec, reward in zip(state.add_task(TaskSpec(id=task_id, instruction="x", samples=len(rewards))),
                                    rewards):
                sid, p1 = spec.session_id, [100 + ord(task_id), spec.sample, 1]
                recorder.call(sid, p1, [11, 2], conversation(task_id, 0))
                recorder.call(sid, p1 + [11, 2, 3], [12, 13, 2], conversation(task_id, 1),
                              no_logprobs=(task_id, spec.sample) == ("a", 1))
                trajs = prefix_merge(recorder.reader.calls(session=sid))
                r = result(task_id, spec.sample, reward).model_copy(update={"session_id": sid, "trajectories": trajs})
                state.put_result(r)
    finally:
        recorder.close()
        state.close()
    out = tmp_path / "out"
    done = run("--state", tmp_path / "rollout.db", "--out", out, "--val-fraction", 0, "--quiet", "--rl")
    assert done.exit_code == 0, done.output
    assert "no logprobs: 1 turns in 1 trajectories" in done.output
    stats = json.loads((out / "stats.json").read_text())
    assert (stats["total"]["trajectories_without_logprobs"], stats["total"]["turns_without_logprobs"]) == (1, 1)
    assert stats["by_task"]["a"]["turns_without_logprobs"] == 1 and stats["by_task"]["b"]["turns_without_logprobs"] == 0

    from datasets import load_dataset

    def check(rows):
        by_flag = {row["has_logprobs"]: row for row in rows}
        assert len(rows) == 3 and sum(not row["has_logprobs"] for row in rows) == 1
        missing, fine = by_flag[False], by_flag[True]
        assert missing["session_id"].startswith("a.1.") and missing["logprobs"][-3:] == [None] * 3
        assert None not in missing["logprobs"][:-3] and missing["loss_mask"][-3:] == [1, 1, 1]
        assert None not in fine["logprobs"] and fine["logprobs"][-3:] == pytest.approx([-0.25, -0.26, -0.27])
        return missing

    table = pq.read_table(out / "tokens" / "train.parquet")
    missing = check(table.to_pylist())
    assert [t["has_logprobs"] for t in missing["turns"]] == [True, False]
    hf = load_dataset("parquet", data_files=str(out / "tokens" / "train.parquet"), split="train",
                      cache_dir=str(tmp_path / "hf"))
    as_json = load_dataset("json", data_files=str(out / "tokens" / "train.jsonl"), split="train",
                           features=tokens.features(), cache_dir=str(tmp_path / "hf"))
    assert check(hf.to_list()) == check(as_json.to_list())
    check(pq.read_table(out / "rl" / "groups.parquet").to_pylist())
    check([json.loads(line) for line in (out / "rl" / "groups.jsonl").read_text().splitlines()])
