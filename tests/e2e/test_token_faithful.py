"""Token-faithful sessions through all four provider APIs (scripted double upstream), on each real
chat template (Qwen3.5-4B, Qwen3 hybrid, Qwen3-Coder): the gateway and the double use the same one.

An 11-call agent session — thinking on and off, parallel tool calls, non-ASCII text, compact
JSON arguments, user messages between tool rounds, a turn truncated by max tokens — must have
every later prompt start with the exact ids of the earlier prompt + sampled ids, and become
exactly one prefix-merged trajectory in which every sampled token appears unchanged.
"""

from __future__ import annotations

import uuid
from itertools import pairwise

import pytest

from polar.tokens.shaping import TemplateTraits
from tests.conftest import real_template
from tests.e2e.sessions import (
    DEVELOPER_FIRST,
    DEVELOPER_LATER,
    DRIVERS,
    INSTRUCTIONS,
    TURNS,
    drive_chat,
    drive_responses,
    script_steps,
)


@pytest.mark.parametrize("thinking", [True, False], ids=["thinking", "no-thinking"])
@pytest.mark.parametrize("provider", list(DRIVERS))
def test_linear_session_is_token_faithful(template_stack, provider, thinking):
    from polar.trajectories.builders import prefix_merge

    stack = template_stack
    session = f"tf-{stack.template}-{provider}-{int(thinking)}-{uuid.uuid4().hex[:6]}"
    stack.script(rules=[{"match": "[session:tf]", "steps": script_steps(thinking)}])
    DRIVERS[provider](stack.url, session, thinking)

    rows = stack.rows(session)
    assert len(rows) == TURNS and all(r["status"] == "ok" for r in rows), [(r["status"], r["error"]) for r in rows]
    stack.assert_served_with_template(rows)
    assert rows[0]["prompt_mode"].startswith("re-render")
    for prev, row in pairwise(rows):
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


CODEX_TURNS = 6


@pytest.mark.parametrize("thinking", [True, False], ids=["thinking", "no-thinking"])
@pytest.mark.parametrize("provider", ["openai_responses", "openai_chat"])
def test_codex_like_session_is_token_faithful(template_stack, request, provider, thinking):
    """Instructions, several developer messages first and one between turns (what Codex sends): every
    call answers, every later prompt extends the previous prompt + sampled ids, and every instruction
    reaches the model. Qwen3.5-4B's template refuses such messages unless the gateway shapes them, and
    every rewrite is recorded on the capture."""

    stack = template_stack
    traits = TemplateTraits.of(real_template(stack.template).read_text())
    session = f"codex-{stack.template}-{provider}-{int(thinking)}-{uuid.uuid4().hex[:6]}"
    stack.script(rules=[{"match": "[session:tf]", "steps": script_steps(thinking)}])
    drive = drive_responses if provider == "openai_responses" else drive_chat
    drive(stack.url, session, thinking, CODEX_TURNS, codex_like=True)

    rows = stack.rows(session)
    assert len(rows) == CODEX_TURNS and all(r["status"] == "ok" for r in rows), [(r["status"], r["error"]) for r in rows]
    stack.assert_served_with_template(rows)
    for prev, row in pairwise(rows):
        assert row["prompt_mode"].startswith("token-faithful"), row["prompt_mode"]
        full = prev["prompt_ids"] + prev["completion_ids"]
        assert row["prompt_ids"][: len(full)] == full
    seen = stack.double.tokenizer.decode(rows[-1]["prompt_ids"])
    assert all(text in seen for text in [INSTRUCTIONS, *DEVELOPER_FIRST, DEVELOPER_LATER])
    notes = [" | ".join(r["rewrites"] or []) for r in rows]
    assert all("leading system/developer messages into one system message" in n for n in notes), notes
    late = [n for n in notes if "carried as a user message" in n]
    assert bool(late) == (not traits.late_system), notes  # only where the template refuses a late system
