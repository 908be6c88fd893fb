"""Token-faithful sessions through all four provider APIs (scripted double upstream).

An 11-call agent session — thinking on and off, parallel tool calls, non-ASCII text, compact
JSON arguments, user messages between tool rounds, a turn truncated by max tokens — must have
every later prompt start with the exact ids of the earlier prompt + sampled ids, and become
exactly one prefix-merged trajectory in which every sampled token appears unchanged.
"""

from __future__ import annotations

import uuid

import pytest

from tests.e2e.sessions import DRIVERS, TURNS, script_steps


@pytest.mark.parametrize("thinking", [True, False], ids=["thinking", "no-thinking"])
@pytest.mark.parametrize("provider", list(DRIVERS))
def test_linear_session_is_token_faithful(stack, provider, thinking):
    from polar.trajectories.builders import prefix_merge

    session = f"tf-{provider}-{int(thinking)}-{uuid.uuid4().hex[:6]}"
    stack.script(rules=[{"match": "[session:tf]", "steps": script_steps(thinking)}])
    DRIVERS[provider](stack.url, session, thinking)

    rows = stack.rows(session)
    assert len(rows) == TURNS and all(r["status"] == "ok" for r in rows), [(r["status"], r["error"]) for r in rows]
    assert rows[0]["prompt_mode"].startswith("re-render")
    for prev, row in zip(rows, rows[1:]):
        assert row["prompt_mode"].startswith("token-faithful"), row["prompt_mode"]
        full = prev["prompt_ids"] + prev["completion_ids"]
        assert row["prompt_ids"][: len(full)] == full  # no sampled id re-encoded
    assert [r["finish_reason"] for r in rows].count("length") == 1
    assert sum(r["finish_reason"] == "tool_calls" for r in rows) >= 6

    trajectories = prefix_merge(rows)
    assert len(trajectories) == 1
    traj = trajectories[0]
    assert traj.token_ids[: rows[-1]["prompt_len"]] == rows[-1]["prompt_ids"]
    for turn, row in zip(traj.turns, rows):
        start, end = turn.completion_start, turn.completion_end
        assert traj.token_ids[start:end] == row["completion_ids"]
        assert all(traj.loss_mask[start:end])
        assert traj.logprobs[start:end] == pytest.approx(row["completion_logprobs"])
    assert sum(traj.loss_mask) == sum(r["completion_len"] for r in rows)
