"""OpenClaw in its default configuration, unchanged in Docker through a rollout node, on the real Qwen3.5
template (scripted double): it fixes the bug with its `exec` tool. Every request ends with its moving
runtime-context message; the shortcut keeps the dropped copies where the model saw them
(`dropped_messages="keep"`, sessions/splice.py), so every call extends the last, every sampled turn reaches
every later prompt id for id, and the session is one trajectory. The figures the issue asks for are printed."""

from __future__ import annotations

import json

import pytest

from polar.harnesses import get
from polar.harnesses.bugfix import FIX, REASONING
from polar.sessions.splice import KEPT
from tests.e2e.test_edited_history import figures, occurs
from tests.harnesses.test_python_agents import qwen35, run_fix  # noqa: F401
from tests.rollout.conftest import node_env  # noqa: F401
from tests.rollout.test_docker import docker_env  # noqa: F401
from tests.support.scheduling import matrix_subset

pytestmark = [pytest.mark.docker, pytest.mark.slow]


@matrix_subset(lambda params: params["api"] == "openai-completions")  # the others: scripts/test_matrix (the
# moving message on Messages and Gemini is in CI through tests/e2e/test_edited_history.py)
@pytest.mark.parametrize(("api", "provider"), [("openai-completions", "openai_chat"), ("anthropic-messages", "anthropic"),
                                               ("openai-responses", "openai_responses"), ("google-generative-ai", "gemini")])
def test_openclaw_default_configuration(qwen35, docker_env, tmp_path, api, provider):  # noqa: F811
    env, _ = docker_env
    harness = get("openclaw")
    steps = [{"reasoning": REASONING, "content": "", "tool_calls": [harness.shell_tool(FIX)]}, {"content": "done"}]
    result, rows = run_fix(env, qwen35, tmp_path, "openclaw", steps, {"api": api})
    assert (result.outcome, result.reward) == ("ok", 1.0), (result.error, result.harness_output)
    assert len(rows) >= 2 and all(r["status"] == "ok" and r["provider"] == provider for r in rows), \
        [(r["status"], r["error"]) for r in rows]
    qwen35.assert_served_with_template(rows)
    for row in rows[1:]:  # (on Responses no call drops a message: each extends the last as the harness sent it)
        assert row["prompt_mode"] in ("token-faithful", f"token-faithful ({KEPT})"), row["prompt_mode"]
    for i, row in enumerate(rows[:-1]):
        assert all(occurs(row["completion_ids"], later["prompt_ids"]) for later in rows[i + 1:])
    extend, carried = figures(rows)
    assert (extend, carried) == (1.0, 1.0)
    (trajectory,) = result.trajectories  # the session's calls, one sequence
    assert trajectory.token_ids == rows[-1]["prompt_ids"] + rows[-1]["completion_ids"]
    assert trajectory.sampled_ids() == [i for r in rows for i in r["completion_ids"]]
    print(json.dumps({"harness": "openclaw", "api": api, "calls": len(rows), "calls_extending_the_last": extend,
                      "kept_dropped_messages": sum(KEPT in r["prompt_mode"] for r in rows),
                      "sampled_tokens_reaching_later_prompts": carried, "trajectories": len(result.trajectories)}))
