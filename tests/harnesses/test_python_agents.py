"""The Python agents from PyPI, installed and run unchanged in Docker through the rollout service, on the
real Qwen3.5 template (scripted double): each fixes the one-bug repository with its own shell tool (or
text action), >= 2 captured calls, token-faithful after the first, one trajectory, reward 1. OpenHands runs on
Chat in CI, on Responses and Messages too under scripts/test_matrix.

The first run builds the agent's image (pip on the host for the sandbox's Python, hundreds of MB, cached
under ~/.cache/polar/pip); later runs reuse it.
"""

from __future__ import annotations

import uuid

import pytest

from polar.harnesses import get
from polar.harnesses.bugfix import CALC, FIX, REASONING, TEST
from polar.harnesses.mini_swe_agent import SUBMIT, MiniSweAgent
from polar.rollout.tasks import Named, TaskSpec
from tests.conftest import real_template
from tests.rollout.conftest import node_env, run_sessions  # noqa: F401
from tests.rollout.test_docker import docker_env  # noqa: F401
from tests.support.scheduling import matrix_subset

pytestmark = [pytest.mark.docker, pytest.mark.slow]


@pytest.fixture
def qwen35(stack):
    stack.use_template(real_template("qwen3.5-4b"))
    stack.template = "qwen3.5-4b"
    yield stack
    stack.use_template(None)
    stack.template = None


def bug_repo(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "calc.py").write_text(CALC)
    (repo / "test_calc.py").write_text(TEST)
    return repo


def run_fix(env, stack, tmp_path, name: str, steps: list[dict], options: dict | None = None):
    """One session of harness `name` on the bug through a rollout node in Docker; its result and rows."""
    marker = f"polar-task-{uuid.uuid4().hex[:8]}"
    stack.script(rules=[{"match": marker, "steps": steps}])
    task = TaskSpec(id=f"py-{name.replace('_', '-')}", instruction=f"[{marker}] The test in test_calc.py fails. "
                    "Fix the bug in calc.py.", runtime="docker", repo=str(bug_repo(tmp_path)), timeout=300,
                    harness=Named(name=name, options=options or {}),
                    evaluator=Named(name="test_output", options={"command": "python3 -m pytest -q test_calc.py"}))
    (result,) = run_sessions(env, [task], timeout=1500)  # the first run builds the image
    rows = [r for r in stack.rows() if marker in json_text(r)]
    return result, rows


def json_text(row: dict) -> str:
    import json

    return json.dumps(row.get("canonical") or {})


def check_faithful(result, rows, stack) -> None:
    assert (result.outcome, result.reward) == ("ok", 1.0), (result.error, result.harness_output)
    assert len(rows) >= 2 and all(r["status"] == "ok" for r in rows), [(r["status"], r["error"]) for r in rows]
    stack.assert_served_with_template(rows) if any(r["finish_reason"] == "tool_calls" for r in rows) else None
    assert rows[0]["prompt_mode"].startswith("re-render")
    for prev, row in zip(rows, rows[1:], strict=False):
        assert row["prompt_mode"].startswith("token-faithful"), row["prompt_mode"]
        full = prev["prompt_ids"] + prev["completion_ids"]
        assert row["prompt_ids"][: len(full)] == full
    (trajectory,) = result.trajectories
    assert len(trajectory.turns) == len(rows)


def test_mini_swe_agent_with_its_bash_tool(qwen35, docker_env, tmp_path):  # noqa: F811
    env, _ = docker_env
    harness = get("mini_swe_agent")
    steps = [{"reasoning": REASONING, "content": "", "tool_calls": [harness.shell_tool(FIX)]},
             {"content": "", "tool_calls": [harness.shell_tool(SUBMIT)]}]
    result, rows = run_fix(env, qwen35, tmp_path, "mini_swe_agent", steps)
    check_faithful(result, rows, qwen35)
    assert [r["provider"] for r in rows] == ["openai_chat"] * len(rows)


def test_mini_swe_agent_text_based(qwen35, docker_env, tmp_path):  # noqa: F811
    """No tools: actions in fenced blocks, observations as user messages; the trajectory and its RL rows hold
    each sampled answer, action included, token for token."""
    from polar.datasets.rl import rl_group

    env, _ = docker_env
    harness = get("mini_swe_agent").with_options(text_based=True)
    assert isinstance(harness, MiniSweAgent)
    steps = [{"content": harness.text_action(FIX, f"THOUGHT: {REASONING}")}, {"content": harness.text_action(SUBMIT)}]
    result, rows = run_fix(env, qwen35, tmp_path, "mini_swe_agent", steps, {"text_based": True})
    check_faithful(result, rows, qwen35)
    assert all(not (r.get("canonical") or {}).get("tools") for r in rows)  # no tools offered: text actions
    decode = qwen35.double.tokenizer.decode
    assert "```mswea_bash_command\n" + FIX in decode(rows[0]["completion_ids"])
    later = rows[1]["canonical"]["messages"]
    assert later[-1]["role"] == "user" and "returncode" in json_text({"canonical": later[-1]})  # the observation
    (trajectory,) = result.trajectories
    for turn, row in zip(trajectory.turns, rows, strict=True):
        assert trajectory.token_ids[turn.completion_start:turn.completion_end] == row["completion_ids"]
    (row,) = rl_group(result.task_id, [result]).rows  # the RL row a trainer gets: every action trainable
    assert row["input_ids"] == list(trajectory.token_ids) and row["reward"] == 1.0
    assert sum(row["loss_mask"]) == sum(len(r["completion_ids"]) for r in rows)


def test_hermes_with_its_terminal_tool(qwen35, docker_env, tmp_path):  # noqa: F811
    """Hermes Agent with no context length configured: it asks polar's model listing first, which answers with
    the upstream's window (no error row); then its calls are token-faithful. Hermes refuses windows under 64K:
    the double serves a wider one for this test (the gateway is rebuilt, so it asks the double again)."""
    env, _ = docker_env
    harness = get("hermes")
    steps = [{"reasoning": REASONING, "content": "", "tool_calls": [harness.shell_tool(FIX)]}, {"content": "done"}]
    window = qwen35.double.max_model_len
    qwen35.double.max_model_len = 131072
    qwen35.use_template(real_template("qwen3.5-4b"))
    try:
        result, rows = run_fix(env, qwen35, tmp_path, "hermes", steps)
    finally:
        qwen35.double.max_model_len = window  # the fixture's teardown rebuilds the gateway again
    check_faithful(result, rows, qwen35)
    session = rows[0]["session_id"]
    assert all(r["status"] == "ok" for r in qwen35.rows(session))  # its probes left no error row


@matrix_subset(lambda params: params["api"] == "chat")  # Responses and Messages: scripts/test_matrix
@pytest.mark.parametrize("api", ["chat", "responses", "messages"])
def test_openhands_with_its_terminal_tool(qwen35, docker_env, tmp_path, api):  # noqa: F811
    """OpenHands' SDK agent (Python 3.12, the host's interpreter laid into its image; tmux for its terminal tool)
    fixes the bug with `terminal`, then ends by answering without a tool call."""
    env, _ = docker_env
    harness = get("openhands").with_options(api=api)
    steps = [{"reasoning": REASONING, "content": "", "tool_calls": [harness.shell_tool(FIX)]},
             {"reasoning": REASONING, "content": "Fixed."}]
    result, rows = run_fix(env, qwen35, tmp_path, "openhands", steps, {"api": api})
    check_faithful(result, rows, qwen35)
    assert {r["provider"] for r in rows} == {harness.provider}
    assert all(r["status"] == "ok" for r in qwen35.rows(rows[0]["session_id"]))  # nothing but model calls
