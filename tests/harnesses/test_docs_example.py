"""docs/harnesses.md's worked example, run as written: the agent script and its `Harness` subclass taken
from the page, registered, and run through a rollout node on the local runtime against the scripted double
on the real Qwen3.5 template: the model calls its `sh` tool with the fix, then answers."""

from __future__ import annotations

import re
import sys
import types
import uuid

import pytest

from polar.harnesses import HARNESSES
from polar.harnesses.bugfix import CALC, FIX, REASONING, TEST
from polar.rollout.tasks import Named, TaskSpec
from tests.conftest import REPO, real_template
from tests.rollout.conftest import node_env, run_sessions  # noqa: F401

pytestmark = pytest.mark.slow  # outside scripts/test_fast: processes killed and restarted, or many started

PAGE = REPO / "docs" / "harnesses.md"


def page_block(name: str) -> str:
    """The python block the page marks `<!-- tested: name -->`."""
    found = re.search(rf"<!-- tested: {re.escape(name)} -->\n```python\n(.*?)\n```", PAGE.read_text(), re.S)
    assert found, f"docs/harnesses.md has no tested block {name!r}"
    return found.group(1)


@pytest.fixture
def tiny_agent(tmp_path):
    source = tmp_path / "tiny_agent.py"
    source.write_text(page_block("tiny_agent.py"))
    module = types.ModuleType("docs_harness")  # a module of its own, as a user's file would be
    sys.modules[module.__name__] = module
    exec(compile(page_block("harness"), str(PAGE), "exec"), module.__dict__)  # registers the harness
    yield source
    HARNESSES.pop("tiny_agent", None)
    sys.modules.pop(module.__name__, None)


def test_the_worked_example_fixes_the_bug(stack, node_env, tiny_agent, tmp_path):  # noqa: F811
    stack.use_template(real_template("qwen3.5-4b"))
    stack.template = "qwen3.5-4b"
    try:
        harness = HARNESSES["tiny_agent"]
        marker = f"polar-docs-{uuid.uuid4().hex[:8]}"
        stack.script(rules=[{"match": marker, "steps": [
            {"reasoning": REASONING, "content": "", "tool_calls": [harness.shell_tool(FIX)]}, {"content": "Fixed."}]}])
        repo = tmp_path / "repo"
        repo.mkdir()
        (repo / "calc.py").write_text(CALC)
        (repo / "test_calc.py").write_text(TEST)
        task = TaskSpec(id="docs-example", instruction=f"[{marker}] Fix the bug in calc.py.", repo=str(repo),
                        harness=Named(name="tiny_agent", options={"source": str(tiny_agent)}),
                        evaluator=Named(name="test_output", options={"command": "{python} -m pytest -q test_calc.py"}))
        (result,) = run_sessions(node_env, [task], timeout=240)
        assert (result.outcome, result.reward) == ("ok", 1.0), (result.error, result.harness_output)
        rows = stack.rows(result.session_id)
        assert len(rows) == 2 and rows[0]["prompt_mode"].startswith("re-render")
        assert rows[1]["prompt_mode"] == "token-faithful"
        stack.assert_served_with_template(rows)
        (trajectory,) = result.trajectories
        assert len(trajectory.turns) == 2
    finally:
        stack.use_template(None)
        stack.template = None
