"""The rollout state survives a reopen: tasks, stages, undrained results; restarts are new attempts."""

from __future__ import annotations

import os

import pytest

from polar.rollout.state import RolloutState
from polar.rollout.tasks import SessionResult, TaskSpec, load_tasks


def result(spec, outcome="ok", reward=1.0) -> SessionResult:
    return SessionResult(session_id=spec.session_id, task_id=spec.task.id, sample=spec.sample, outcome=outcome,
                         reward=reward)


def test_results_and_unfinished_sessions_survive_a_reopen(tmp_path):
    state = RolloutState(tmp_path / "rollout.db")
    specs = state.add_task(TaskSpec(id="t1", instruction="fix it", samples=3))
    state.set_stage(specs[0].session_id, "running")
    first = state.put_result(result(specs[0]))
    second = state.put_result(result(specs[1], "timeout", 0.0))
    assert state.put_result(result(specs[1])) == second  # a replayed session keeps its first result
    state.ack([first])
    state.close()

    state = RolloutState(tmp_path / "rollout.db")
    assert [(seq, r.outcome) for seq, r in state.results()] == [(second, "timeout")]
    assert [seq for seq, _ in state.results(undrained_only=False)] == [first, second]
    (again,) = state.requeue()
    assert again.session_id == specs[2].session_id and again.attempt == 1
    assert again.capture_id == f"{again.session_id}.r1"
    counts = state.counts()
    assert counts["stages"] == {"done": 2, "queued": 1} and counts["outcomes"] == {"ok": 1, "timeout": 1}
    assert counts["undrained"] == 1 and counts["rewards"] == {"n": 2, "mean": 0.5}


def test_duplicate_tasks_and_unknown_cancels_are_refused(tmp_path):
    state = RolloutState(tmp_path / "rollout.db")
    state.add_task(TaskSpec(id="t1", instruction="x"))
    with pytest.raises(ValueError, match="already submitted"):
        state.add_task(TaskSpec(id="t1", instruction="x"))
    with pytest.raises(KeyError):
        state.cancel_task("nope")
    with pytest.raises(ValueError, match="should match pattern"):
        TaskSpec(id="../etc", instruction="x")
    assert len(state.cancel_task("t1")) == 1


def test_shipped_tasks_load_with_paths_resolved():
    tasks = load_tasks("data/tasks/tasks.jsonl")
    assert [t.id for t in tasks] == ["calc-mean", "textutil-slugify"]
    for t in tasks:
        assert t.repo and os.path.isdir(t.repo)
        assert os.path.isdir(t.evaluator.options["hidden"])
        assert t.evaluator.name == "swe" and t.samples == 2
