"""Multi-turn trajectories (token-faithful sessions driven by the official SDKs) exported as chat rows
that re-render, turn by turn, to exactly the captured tokens with the project's template.

The main job's Claude Code sessions split into one-turn trajectories (see test_main_job_export), so
the turn-by-turn rebuilding of a conversation from its captured calls is checked here: parallel tool
calls, non-ASCII text, user messages between tool rounds, reasoning on every turn, and the
Anthropic format Claude Code speaks.
"""

from __future__ import annotations

import uuid

import pytest

from polar.datasets import ExportConfig, Selection, export_dataset, load_chat
from polar.rollout.state import RolloutState
from polar.rollout.tasks import SessionResult, TaskSpec
from polar.tokens.template import ChatTemplate
from polar.trajectories.builders import prefix_merge
from tests.conftest import REPO
from tests.e2e.sessions import drive_anthropic, drive_chat, script_steps

PROJECT_TEMPLATE = REPO / "data" / "chat_templates" / "qwen3.5-xml-tools.jinja"


@pytest.fixture(scope="module")
def template(tokenizer_dir) -> ChatTemplate:
    return ChatTemplate.from_dir(tokenizer_dir, PROJECT_TEMPLATE)


def record(state: RolloutState, stack, task_id: str, drive, samples: int = 1) -> list[SessionResult]:
    """Run `drive(url, session)` once per sample of a new task and store each session's result as
    POSTRUN would (prefix-merged trajectories of its captured calls, a reward)."""
    results = []
    for spec in state.add_task(TaskSpec(id=task_id, instruction="x", samples=samples)):
        drive(stack.url, spec.session_id)
        trajectories = prefix_merge(stack.rows(spec.session_id))
        for t in trajectories:
            t.task, t.reward = task_id, 1.0
        result = SessionResult(session_id=spec.session_id, task_id=task_id, sample=spec.sample, outcome="ok",
                               reward=1.0, trajectories=trajectories)
        state.put_result(result)
        results.append(result)
    return results


def test_multi_turn_chat_rows_rerender_turn_by_turn(stack, template, tmp_path):
    tag = uuid.uuid4().hex[:6]
    stack.script(rules=[{"match": "[session:tf]", "steps": script_steps(True)}])
    state = RolloutState(tmp_path / "rollout.db")
    chat_results = record(state, stack, f"chat-{tag}", lambda url, s: drive_chat(url, s, thinking=True, turns=6))
    anthropic_results = record(state, stack, f"anthropic-{tag}", lambda url, s: drive_anthropic(url, s, True))
    state.close()

    out = tmp_path / "out"
    result = export_dataset(ExportConfig(state=tmp_path / "rollout.db", captures=stack.db, out=out, val_fraction=0.5,
                                         template=template, selection=Selection(include_truncated=True)),
                            progress=False)
    stats = result.stats
    # one trajectory per session: the prompt of every call extended the previous call's tokens
    assert [len(r.trajectories) for r in chat_results + anthropic_results] == [1, 1]
    assert stats["total"]["accepted"] == 2 and stats["chat"]["rows"] == 2
    assert stats["chat"]["rerender"] == {"checked": 2, "exact": 2, "mismatches": []}

    rows = {row["trajectory_id"]: row for split in ("train", "validation")
            for row in load_chat(str(out), split, cache_dir=str(tmp_path / "hf"))}
    trajectories = {t.id: t for r in chat_results + anthropic_results for t in r.trajectories}
    for tid, t in trajectories.items():
        row = rows[tid]
        trained = [i for i, m in enumerate(row["messages"]) if m["train"]]
        assert len(trained) == len(t.turns) and all(row["messages"][i]["role"] == "assistant" for i in trained)
        assert all(row["messages"][i].get("reasoning_content") for i in trained)  # reasoning on every turn
        # each turn's prompt is the rendering of the conversation up to that turn (prefix-stable)
        for turn, at in zip(t.turns, trained):
            ids = template.prompt_ids(row["messages"][:at], row["tools"], **row["chat_template_kwargs"])
            assert ids == t.token_ids[: turn.completion_start], (tid, at)
    chat_row = rows[chat_results[0].trajectories[0].id]
    calls = [m["tool_calls"] for m in chat_row["messages"] if m.get("tool_calls")]
    assert max(len(c) for c in calls) == 2  # parallel calls
    assert calls[0][0]["function"]["arguments"] == {"path": "src/app.py"}  # parsed back into an object
    assert any("修复中" in m["content"] for m in chat_row["messages"])
    assert [m["role"] for m in chat_row["messages"]].count("user") == 2  # the follow-up between tool rounds
    assert {t["function"]["name"] for t in chat_row["tools"]} == {"read_file", "edit_file", "run"}


def test_empty_reasoning_is_text_faithful_but_not_token_faithful(stack, template, tmp_path):
    """With thinking on, a turn that samples no reasoning starts with a lone newline token after the
    generation prompt's `<think>` line; a whole-conversation rendering merges the two newlines into
    one token. The export reports such rows rather than passing them as exact (docs/datasets.md)."""
    tag = uuid.uuid4().hex[:6]
    stack.script(rules=[{"match": "[session:tf]", "steps": script_steps(False)}])  # no reasoning anywhere
    state = RolloutState(tmp_path / "rollout.db")
    (r,) = record(state, stack, f"empty-{tag}", lambda url, s: drive_chat(url, s, thinking=True, turns=2))
    state.close()
    result = export_dataset(ExportConfig(state=tmp_path / "rollout.db", captures=stack.db, out=tmp_path / "out",
                                         val_fraction=0.0, template=template, formats=("jsonl",)), progress=False)
    check = result.stats["chat"]["rerender"]
    assert (check["checked"], check["exact"]) == (1, 0)
    (t,) = r.trajectories
    first = t.turns[0].completion_start
    assert check["mismatches"][0]["problem"].startswith(f"differs at token {first - 1} ")
    assert template.decode(t.token_ids[first - 1 : first + 1]) == "\n\n"  # prompt's "\n" + sampled "\n"
    (row,) = load_chat(str(tmp_path / "out"), "train", cache_dir=str(tmp_path / "hf"))
    text = template.render(row["messages"], row["tools"], add_generation_prompt=False, **row["chat_template_kwargs"])
    assert text.startswith(template.decode(t.token_ids))  # the text is the same; only the token split differs
