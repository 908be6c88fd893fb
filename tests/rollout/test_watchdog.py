"""The long tail cut: a scripted model that repeats one tool call forever ends as `looping` after the
configured count, its partial trajectory and the flag in `stream_rl_groups` and `polar export`, while the
rollout's other sessions run on unaffected; a harness that stops calling the model ends as `stalled`, its
sandbox intact for the evaluation; a token budget ends a session as `budget`."""

from __future__ import annotations

import re

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from polar.cli import main
from polar.cli.export import export
from polar.datasets.rl import group_sizes, stream_rl_groups
from polar.rollout.client import RolloutClient
from polar.rollout.lifecycle import SessionPhases
from polar.rollout.node import GatewayNode, NodeConfig
from polar.rollout.service import LocalNode, RolloutService
from polar.rollout.state import RolloutState
from polar.rollout.tasks import Named, TaskSpec, WatchdogOptions, load_tasks
from tests.rollout.conftest import TASKS, ApiServer, run_sessions
from tests.rollout.test_docker import docker_env  # noqa: F401  (the fixture)

READ_FOREVER = {"name": "read_file", "arguments": {"path": "calc.py"}}
# A harness that cannot end by itself first (the python agent's own limit is 20 steps): only the cut ends it.
ENDLESS = Named(name="python-agent", options={"max_steps": 100_000})
FIX = {"name": "edit_file", "arguments": {"path": "calc.py", "old": "(len(values) + 1)", "new": "len(values)"}}


def test_a_looping_session_is_cut_flagged_and_exported_the_others_unaffected(stack, node_env, tmp_path):
    stack.script(rules=[{"match": "LOOP-FOREVER", "steps": [{"tool_calls": [READ_FOREVER]}]},
                        {"match": "calc.py", "steps": [{"tool_calls": [FIX]}, {"content": "Fixed."}]}])
    fine = load_tasks(TASKS / "tasks.jsonl")[0]  # calc-mean, two samples
    looping = fine.model_copy(update={"id": "calc-loop", "samples": 1, "instruction": "LOOP-FOREVER " + fine.instruction,
                                      "harness": ENDLESS,
                                      "watchdog": WatchdogOptions(repeated_tool_calls=3, poll_seconds=0.1)})
    # The run's options: a budget no session reaches; the looping task adds its own count over them.
    config = NodeConfig(running_slots=3, watchdog=WatchdogOptions(token_budget=10**9, poll_seconds=0.1))
    state = tmp_path / "rollout.db"

    def make():
        node = LocalNode(GatewayNode(SessionPhases(node_env, config), config), node_env.capture_db)
        return RolloutService(RolloutState(state), [node])

    with ApiServer(state, make=make) as server, RolloutClient(server.url) as client:
        sizes = group_sizes(client.submit([fine, looping]))
        groups = {g.group_id: g for g in _take(stream_rl_groups(client, sizes), 2)}
    results = {f"{r.task_id}.{r.sample}": r for r in RolloutState(state).all_results()}
    cut = results["calc-loop.0"]
    assert (cut.outcome, cut.partial, cut.cut["reason"]) == ("looping", True, "looping"), cut
    assert "the same tool call 3 times in a row: read_file" in cut.cut["detail"]
    (trajectory,) = cut.trajectories
    # Cut once the third identical call was captured (the harness may have gone on until the next poll),
    # its process group killed: nothing else ends this harness.
    assert cut.harness_exit == -9 and len(trajectory.turns) >= 3 and trajectory.metadata["cut"] == "looping"
    assert cut.reward == 0.0 and cut.evaluation["fail_to_pass"]
    for sample in (0, 1):
        ok = results[f"calc-mean.{sample}"]
        assert (ok.outcome, ok.reward, ok.cut, ok.partial) == ("ok", 1.0, None, False), ok
    assert [row["cut"] for row in groups["calc-loop"].rows] == ["looping"]
    assert [row["cut"] for row in groups["calc-mean"].rows] == [None, None]

    out = tmp_path / "dataset"
    done = CliRunner().invoke(export, ["--state", str(state), "--captures", node_env.capture_db, "--out", str(out),
                                       "--outcome", "ok", "--outcome", "looping", "--include-partial",
                                       "--val-fraction", "0.5", "--format", "parquet", "--no-dedup"])
    assert done.exit_code == 0, done.output
    rows = [r for split in ("train", "validation") for r in pq.read_table(out / "tokens" / f"{split}.parquet").to_pylist()]
    assert sorted((r["task"], r["cut"]) for r in rows) == [("calc-loop", "looping"), ("calc-mean", None),
                                                           ("calc-mean", None)]
    done = CliRunner().invoke(export, ["--state", str(state), "--out", str(tmp_path / "default"), "--format", "jsonl",
                                       "--captures", node_env.capture_db])
    assert done.exit_code == 0 and "calc-loop" not in (tmp_path / "default" / "tokens" / "train.jsonl").read_text()

    done = CliRunner().invoke(main, ["report", "--state", str(state), "--out", str(tmp_path / "report.html")])
    assert done.exit_code == 0, done.output
    summary = dict(re.findall(r"<tr>\s*<th>([^<]+)</th>\s*<td>([^<]+)</td>", (tmp_path / "report.html").read_text()))
    assert summary["outcomes"] == "ok 2 · looping 1" and summary["cut by the watchdog"] == "looping 1"


def test_stalled_repeating_and_over_budget_sessions_are_cut(stack, node_env):
    """A harness that stops calling the model is cut as `stalled`; its sandbox stays for the evaluation
    (the file it wrote is still there). A model whose answer degenerates into one repeated span is cut as
    `looping`. A session whose sampled tokens reach its budget ends as `budget`."""
    babble = "I should read the file once more. " * 4
    stack.script(rules=[{"match": "BUDGET", "steps": [{"tool_calls": [READ_FOREVER]}]},
                        # Babbling on every turn, under a harness that cannot end by itself: only the cut ends it (a
                        # session that fixed the bug next could end before a poll on a loaded host).
                        {"match": "BABBLE", "steps": [{"content": "Let me see. " + babble, "tool_calls": [READ_FOREVER]}]}])
    stall = TaskSpec(id="stall", instruction="x", timeout=60,
                     harness=Named(name="shell", options={"script": "echo made > made.txt; sleep 50"}),
                     evaluator=Named(name="test_output", options={"command": "test -f made.txt"}),
                     watchdog=WatchdogOptions(stall_seconds=1.0, poll_seconds=0.2))
    calc = load_tasks(TASKS / "tasks.jsonl")[0]
    budget = calc.model_copy(update={"id": "over-budget", "samples": 1, "instruction": "BUDGET", "harness": ENDLESS,
                                     "watchdog": WatchdogOptions(token_budget=1, poll_seconds=0.2)})
    babbling = calc.model_copy(update={"id": "babble", "samples": 1, "instruction": "BABBLE", "harness": ENDLESS,
                                       "watchdog": WatchdogOptions(repeated_text=3, stall_seconds=30)})
    stalled, spent, looped = run_sessions(node_env, [stall, budget, babbling], timeout=90, running_slots=3)
    assert (stalled.outcome, stalled.reward, stalled.cut["reason"]) == ("stalled", 1.0, "stalled"), stalled
    assert "no model call for" in stalled.cut["detail"] and stalled.harness_exit == -9
    assert (spent.outcome, spent.cut["reason"], spent.partial) == ("budget", "budget", True), spent
    assert spent.cut["detail"].endswith("tokens sampled (budget 1)") and spent.harness_exit == -9
    assert (looped.outcome, looped.partial) == ("looping", True), looped
    assert looped.cut["detail"] == "the answer repeats one span 3+ times: ' I should read the file once more.'"


def _take(iterator, n):
    out = []
    for item in iterator:
        out.append(item)
        if len(out) == n:
            return out
    return out


@pytest.mark.docker
def test_a_stalled_container_session_is_cut_and_still_evaluated(docker_env):  # noqa: F811
    """In a container the cut ends the harness's process group through the recorded pid; the container
    stays for the evaluation."""
    env, image = docker_env
    stall = TaskSpec(id="stall-in-docker", instruction="x", timeout=120, runtime="docker", image=image,
                     harness=Named(name="shell", options={"script": "echo made > made.txt; sleep 100"}),
                     evaluator=Named(name="test_output", options={"command": "test -f made.txt"}),
                     watchdog=WatchdogOptions(stall_seconds=2.0, poll_seconds=0.2))
    (result,) = run_sessions(env, [stall], timeout=240)
    assert (result.outcome, result.reward, result.partial) == ("stalled", 1.0, True), result
    assert result.harness_exit == 137  # SIGKILL, seen through the container's exec
