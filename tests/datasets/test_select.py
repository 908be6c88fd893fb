"""Selection and splitting on hand-built session results: threshold, status, dedup, determinism."""

from __future__ import annotations

import pytest

from polar.datasets.select import Candidate, Selection, assign_splits, select, split
from tests.datasets.crafted import result


def candidates(results):
    return [Candidate(t, r, "python-agent") for r in results for t in r.trajectories]


def ids(cs):
    return [c.trajectory.id for c in cs]


def test_reward_threshold_and_missing_rewards():
    rs = [result("a", 0, 1.0), result("a", 1, 0.4), result("b", 0, None), result("b", 1, 0.5)]
    assert ids(select(candidates(rs)).accepted) == ["a.0#0", "a.1#0", "b.0#0", "b.1#0"]  # no threshold: all
    picked = select(candidates(rs), Selection(min_reward=0.5))
    assert ids(picked.accepted) == ["a.0#0", "b.1#0"]
    assert picked.rejected == {"reward below threshold": 1, "no reward": 1}
    assert (picked.attempted, picked.sessions) == (4, 4)


def test_finished_status_and_configurable_flags():
    rs = [result("t", 0), result("t", 1, outcome="error"), result("t", 2, outcome="timeout"),
          result("t", 3, truncated=True), result("t", 4, broken_prefix=True), result("t", 5, partial=True)]
    picked = select(candidates(rs))
    assert ids(picked.accepted) == ["t.0#0", "t.4#0"]  # broken prefixes are kept by default
    assert picked.rejected == {"session error": 1, "session timeout": 1, "truncated": 1, "partial": 1}

    strict = select(candidates(rs), Selection(include_broken_prefix=False))
    assert ids(strict.accepted) == ["t.0#0"] and strict.rejected["broken prefix"] == 1
    loose = select(candidates(rs), Selection(outcomes=frozenset({"ok", "timeout"}), include_truncated=True,
                                             include_partial=True))
    assert ids(loose.accepted) == ["t.0#0", "t.2#0", "t.3#0", "t.4#0", "t.5#0"]


def test_identical_trajectories_are_kept_once():
    same = [1, 2, 3, 4, 5]
    rs = [result("t", 0, tokens=same), result("t", 1, tokens=same), result("u", 0, tokens=same),
          result("t", 2, tokens=[9, 2, 3, 4, 5])]
    picked = select(candidates(rs))
    assert ids(picked.accepted) == ["t.0#0", "t.2#0"] and picked.rejected == {"duplicate": 2}
    assert len(select(candidates(rs), Selection(dedup=False)).accepted) == 4
    # a rejected copy does not hide an accepted one
    rs = [result("t", 0, 0.0, tokens=same), result("t", 1, 1.0, tokens=same)]
    assert ids(select(candidates(rs), Selection(min_reward=1.0)).accepted) == ["t.1#0"]


def test_split_is_deterministic_by_task_and_never_straddles():
    rs = [result(f"task-{i}", s, extra=s % 2) for i in range(40) for s in range(3)]
    accepted = select(candidates(rs)).accepted
    first = split(accepted, 0.25, seed=7)
    again = split(list(accepted), 0.25, seed=7)
    assert {k: ids(v) for k, v in first.items()} == {k: ids(v) for k, v in again.items()}
    train_tasks = {c.task for c in first["train"]}
    val_tasks = {c.task for c in first["validation"]}
    assert train_tasks and val_tasks and not train_tasks & val_tasks
    assert len(train_tasks | val_tasks) == 40 and 2 <= len(val_tasks) <= 20  # about a quarter of 40
    other = split(accepted, 0.25, seed=8)
    assert {c.task for c in other["validation"]} != val_tasks  # the seed matters
    by_session = split(accepted, 0.25, seed=7, by="session")
    for c in by_session["validation"]:  # a session's trajectories stay together
        assert all(o.result.session_id != c.result.session_id for o in by_session["train"])


def test_a_group_keeps_its_split_as_more_tasks_arrive():
    few = assign_splits([f"t{i}" for i in range(50)], 0.2, seed=3)
    more = assign_splits([f"t{i}" for i in range(500)], 0.2, seed=3)
    assert all(more[k] == v for k, v in few.items())


def test_small_exports_still_get_both_splits():
    for seed in range(20):
        splits = assign_splits(["a", "b"], 0.1, seed)
        assert sorted(splits.values()) == ["train", "validation"]
    assert set(assign_splits(["a", "b", "c"], 0.0).values()) == {"train"}
    assert assign_splits(["only"], 0.5, 1) in ({"only": "train"}, {"only": "validation"})
    with pytest.raises(ValueError, match="fraction"):
        assign_splits(["a"], 1.0)
