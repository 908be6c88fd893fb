"""Real sessions: the python agent fixes a shipped task through polar; evaluators score it."""

from __future__ import annotations

import asyncio

import pytest
from click.testing import CliRunner

from polar.cli.rollout import export
from polar.rollout.lifecycle import SessionPhases
from polar.rollout.node import GatewayNode, NodeConfig
from polar.rollout.service import LocalNode, RolloutService
from polar.rollout.state import RolloutState
from polar.rollout.tasks import Named, TaskSpec, load_tasks
from polar.trajectories.io import read
from tests.rollout.conftest import TASKS, run_sessions

FIXES = {  # what the scripted model does for each shipped task: the reference fix, as an edit_file call
    name: {"name": "edit_file", "arguments": {"path": name, "old": old, "new": new}}
    for name, old, new in [("calc.py", "(len(values) + 1)", "len(values)"), ("textutil.py", '.split(" ")', ".split()")]
}


def test_shipped_tasks_end_scored_in_sqlite(stack, node_env, tmp_path):
    """The service runs the shipped SWE tasks with the python agent; rewards and trajectories persist."""
    stack.script(rules=[
        {"match": "BROKEN-ATTEMPT", "steps": [{"content": "I give up."}]},
        *({"match": name, "steps": [{"reasoning": "found the bug", "tool_calls": [fix]}, {"content": "Fixed."}]}
          for name, fix in FIXES.items()),
    ])
    tasks = load_tasks(TASKS / "tasks.jsonl")
    lazy = tasks[0].model_copy(
        update={"id": "calc-lazy", "samples": 1, "instruction": "BROKEN-ATTEMPT " + tasks[0].instruction})

    async def main():
        config = NodeConfig(running_slots=3, init_workers=2, postrun_workers=2)
        node = LocalNode(GatewayNode(SessionPhases(node_env, config), config), node_env.capture_db)
        service = RolloutService(RolloutState(tmp_path / "rollout.db"), [node])
        await service.start()
        try:
            await service.submit([*tasks, lazy])
            async with asyncio.timeout(120):
                async for item in service.results(follow=True, heartbeat=0.5):
                    if item and item[0] == 5:
                        break
        finally:
            await service.close()

    asyncio.run(main())
    results = {r.session_id: r for _, r in RolloutState(tmp_path / "rollout.db").results()}  # reopened from disk
    by_task = {t: sorted((r.outcome, r.reward) for r in results.values() if r.task_id == t)
               for t in ("calc-mean", "textutil-slugify", "calc-lazy")}
    assert by_task == {"calc-mean": [("ok", 1.0)] * 2, "textutil-slugify": [("ok", 1.0)] * 2,
                       "calc-lazy": [("ok", 0.0)]}, results
    good = next(r for r in results.values() if r.task_id == "calc-mean")
    bad = next(r for r in results.values() if r.task_id == "calc-lazy")
    assert all(good.evaluation["fail_to_pass"].values()) and all(good.evaluation["pass_to_pass"].values())
    assert not any(bad.evaluation["fail_to_pass"].values()) and all(bad.evaluation["pass_to_pass"].values())
    (trajectory,) = good.trajectories
    assert [t.finish_reason for t in trajectory.turns] == ["tool_calls", "stop"]
    assert trajectory.reward == 1.0 and trajectory.task == "calc-mean" and trajectory.trainable_tokens > 0
    assert len(bad.trajectories[0].turns) == 1
    # The hidden tests never reached the session's workdir; only the evaluator's clean copy saw them.
    assert "test_hidden" not in trajectory.model_dump_json()

    out = tmp_path / "scored.jsonl"
    exported = CliRunner().invoke(export, ["--state", str(tmp_path / "rollout.db"), "--out", str(out)])
    assert exported.exit_code == 0 and "5 trajectories written" in exported.output, exported.output
    assert sorted(t.reward for t in read(out)) == [0.0, 1.0, 1.0, 1.0, 1.0]


ONE_CALL = (
    "{python} -c \"import openai; openai.OpenAI(max_retries=0).chat.completions.create("
    "model='m', messages=[{'role': 'user', 'content': 'one call'}])\""
)


def test_timed_out_harness_keeps_its_partial_trajectory(stack, node_env):
    hang = Named(name="shell", options={"script": f"{ONE_CALL} && sleep 30"})
    task = TaskSpec(id="slow", instruction="x", timeout=3, harness=hang)
    (result,) = run_sessions(node_env, [task])
    assert result.outcome == "timeout" and result.partial and result.reward == 0.0
    (trajectory,) = result.trajectories
    assert len(trajectory.turns) == 1 and trajectory.metadata["timed_out"] is True


def crashing_evaluator(ctx, **options):
    raise RuntimeError("grader exploded")


def per_turn(ctx, **options):
    turns = max(len(t.turns) for t in ctx.trajectories)
    return {"reward": 0.5, "step_rewards": [0.1] * turns}


def test_evaluator_kinds_and_crashes(stack, node_env, tmp_path):
    script = tmp_path / "reward.sh"
    script.write_text('grep -q hello out.txt && echo 0.75 > "$POLAR_REWARD_FILE"\n')
    shell = Named(name="shell", options={"script": f"echo hello > out.txt && {ONE_CALL}"})
    tasks = [
        TaskSpec(id="script", instruction="x", harness=shell,
                 evaluator=Named(name="script_reward", options={"script": str(script)})),
        TaskSpec(id="tests", instruction="x", harness=shell, evaluator=Named(
            name="test_output", options={"command": "test -f out.txt && echo '{\"reward\": 0.25}'", "parse": "json"})),
        TaskSpec(id="custom", instruction="x", harness=shell, evaluator=Named(name=f"{__name__}:per_turn")),
        TaskSpec(id="crash", instruction="x", harness=shell, evaluator=Named(name=f"{__name__}:crashing_evaluator")),
        TaskSpec(id="no-runtime", instruction="x", runtime="nowhere"),
        TaskSpec(id="failing-harness", instruction="x",
                 harness=Named(name="shell", options={"script": "echo boom >&2; exit 3"})),
    ]
    script_r, tests_r, custom_r, crash_r, runtime_r, failing_r = run_sessions(node_env, tasks, running_slots=3)
    assert (script_r.outcome, script_r.reward) == ("ok", 0.75)
    assert (tests_r.outcome, tests_r.reward) == ("ok", 0.25)
    assert custom_r.reward == 0.5 and custom_r.trajectories[0].step_rewards == [0.1]
    assert crash_r.outcome == "error" and "grader exploded" in crash_r.error and crash_r.trajectories
    assert runtime_r.outcome == "error" and "runtime 'nowhere' is not available" in runtime_r.error
    assert (failing_r.outcome, failing_r.reward, failing_r.harness_exit) == ("ok", 0.0, 3)
    assert "boom" in failing_r.harness_output


def test_unknown_names_fail_clearly():
    from polar.harnesses import make_harness
    from polar.rollout.evaluators import make_evaluator

    with pytest.raises(ValueError, match="unknown harness 'nope'"):
        make_harness("nope")
    with pytest.raises(ValueError, match="unknown evaluator 'nope'"):
        make_evaluator(Named(name="nope"))


def test_a_cli_harness_is_refused_on_the_host(stack, node_env):
    task = TaskSpec(id="cli-on-host", instruction="x", harness=Named(name="claude_code"))
    (result,) = run_sessions(node_env, [task])
    assert result.outcome == "error" and "use a container runtime" in result.error


def test_cancel_ends_a_running_harness(node_env):
    """Cancelling a session whose harness is running ends the harness now, not at its deadline."""
    import asyncio
    import time

    from polar.rollout.lifecycle import SessionPhases
    from polar.rollout.node import GatewayNode, NodeConfig
    from polar.rollout.tasks import Named, SessionSpec, TaskSpec

    task = TaskSpec(id="long", instruction="x", runtime="local", timeout=120,
                    harness=Named(name="shell", options={"script": "sleep 100"}), evaluator=Named(name="completed"))

    async def main():
        cfg = NodeConfig(running_slots=1)
        node = GatewayNode(SessionPhases(node_env, cfg), cfg)
        node.start()
        (spec,) = SessionSpec.expand(task)
        node.submit(spec)
        try:
            async with asyncio.timeout(60):
                while not any(kind == "stage" and payload[1] == "running"
                              for kind, payload in await node.next_events(0.2)):
                    pass
                started = time.monotonic()  # at once: the harness may not have started yet
                node.cancel([spec.session_id])
                while not (results := [p for kind, p in await node.next_events(0.5) if kind == "result"]):
                    pass
            return results[0], time.monotonic() - started
        finally:
            await node.stop()
            node.phases.close()

    result, seconds = asyncio.run(main())
    assert result.outcome == "cancelled" and seconds < 15, (result, seconds)
