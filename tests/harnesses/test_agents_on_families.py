"""The four agents (OpenClaw, Hermes Agent, mini-swe-agent, OpenHands), unchanged in Docker through a rollout
node, on the other model families' real templates (scripted double sampling in the family's own format, on the
vocabulary the family tests use: tests/conftest.py `template_stack`): each fixes the bug with its own shell tool,
>= 2 captured calls, token-faithful after the first, one trajectory, reward 1 — as on Qwen3.5
(tests/harnesses/test_python_agents.py, tests/harnesses/test_openclaw.py). CI runs each agent on one family, the
four spread over four families; `scripts/test_matrix` runs every agent on every family.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from polar.harnesses import get
from polar.harnesses.bugfix import FIX, REASONING
from polar.harnesses.mini_swe_agent import SUBMIT
from tests.conftest import template_file
from tests.harnesses.test_cli_harnesses import OTHER_FAMILIES
from tests.harnesses.test_python_agents import check_faithful, run_fix
from tests.rollout.conftest import node_env  # noqa: F401
from tests.rollout.test_docker import docker_env  # noqa: F401
from tests.support.scheduling import matrix_subset

pytestmark = [pytest.mark.docker, pytest.mark.slow]

AGENTS = ("openclaw", "hermes", "mini_swe_agent", "openhands")
LAST = {"openclaw": {"content": "done"}, "hermes": {"content": "done"}, "openhands": {"content": "Fixed."},
        "mini_swe_agent": {"content": "", "tool_calls": [get("mini_swe_agent").shell_tool(SUBMIT)]}}
CI = {("openclaw", "glm-4.6"), ("hermes", "gpt-oss"), ("mini_swe_agent", "llama-3.3"), ("openhands", "deepseek-v3.1")}


@matrix_subset(lambda params: (params["agent"], params["template_stack"]) in CI)
@pytest.mark.parametrize("template_stack", OTHER_FAMILIES, indirect=True)
@pytest.mark.parametrize("agent", AGENTS)
def test_agent_fixes_the_bug_on_another_family(template_stack, docker_env, tmp_path, agent):  # noqa: F811
    env, _ = docker_env
    stack = template_stack
    steps = [{"reasoning": REASONING, "content": "", "tool_calls": [get(agent).shell_tool(FIX)]}, LAST[agent]]
    window = stack.double.max_model_len
    if agent == "hermes":  # it refuses windows under 64K: the double serves a wider one (the gateway asks it again)
        serve_window(stack, 131072)
    try:
        result, rows = run_fix(env, stack, tmp_path, agent, steps)
    finally:
        if agent == "hermes":
            serve_window(stack, window)
    check_faithful(result, rows, stack)
    assert all(r["status"] == "ok" for r in stack.rows(rows[0]["session_id"]))  # probes left no error row


def serve_window(stack, tokens: int) -> None:
    """The double serves this context window; the gateway, rebuilt on the same template and vocabulary, reads it."""
    stack.double.max_model_len = tokens
    stack.use_template(template_file(stack.template), Path(stack.proxy.master.options.polar_tokenizer))
