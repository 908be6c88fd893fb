"""`polar report` on a training run: the rewards section carries the learning curve by policy version."""

from __future__ import annotations

import re

from polar.reporting import write_report
from polar.rollout.state import RolloutState
from polar.rollout.tasks import SessionResult, TaskSpec


def training_state(path, rewards_by_version: dict[int, list[float]], stale_at: int | None = None) -> None:
    state = RolloutState(path)
    for version, rewards in rewards_by_version.items():
        task = TaskSpec(id=f"step-{version}", instruction="x", samples=len(rewards) + (stale_at == version))
        sessions = state.add_task(task)
        for spec, reward in zip(sessions, rewards):
            state.put_result(SessionResult(session_id=spec.session_id, task_id=task.id, sample=spec.sample,
                                           outcome="ok", reward=reward, policy_version=version))
        if stale_at == version:
            spec = sessions[-1]
            state.put_result(SessionResult(session_id=spec.session_id, task_id=task.id, sample=spec.sample,
                                           outcome="stale", policy_version=version))
    state.close()


def test_rewards_by_policy_version_are_plotted_and_tabled(tmp_path):
    training_state(tmp_path / "r.db", {0: [0.1, 0.3], 1: [0.4, 0.6], 2: [0.8, 1.0]}, stale_at=2)
    data = write_report(tmp_path / "r.html", state=tmp_path / "r.db")
    html = (tmp_path / "r.html").read_text()
    assert sorted(re.findall(r'data-plot="([^"]+)"', html)) == ["reward-by-version", "rewards"]
    assert "per policy version" in html
    assert {v: len(ss) for v, ss in data.by_policy_version().items()} == {0: 2, 1: 2, 2: 3}
    rows = re.findall(r"<tr>\s*<td class=\"num\">(\d)</td>\s*<td class=\"num\">(\d)</td>\s*<td>([^<]*)</td>\s*"
                      r"<td class=\"num\">([\d.]+)</td>", html)
    assert rows == [("0", "2", "ok 2", "0.200"), ("1", "2", "ok 2", "0.500"), ("2", "3", "ok 2 · stale 1", "0.900")]


def test_a_run_at_one_policy_version_has_no_curve(tmp_path):
    training_state(tmp_path / "r.db", {3: [0.1, 0.3]})
    write_report(tmp_path / "r.html", state=tmp_path / "r.db")
    html = (tmp_path / "r.html").read_text()
    assert "reward-by-version" not in html and "per policy version" not in html
