"""SWE-bench instances graded as the official harness grades them: gold patch 1.0, empty 0.0, a partial fix
unresolved, on small real repositories in SWE-bench layout, each verdict checked against swebench's grading
functions on the same test log; through a real rollout session and through `polar evaluate`."""

from __future__ import annotations

import json
import sys

import pytest
from click.testing import CliRunner
from swebench.harness.constants import FAIL_TO_PASS, PASS_TO_PASS, ResolvedStatus
from swebench.harness.grading import get_eval_tests_report, get_logs_eval, get_resolution_status

from polar.cli import main
from polar.rollout.swebench_eval import clean_sandbox, env_for_tests, grade, normalise, swebench_spec
from polar.rollout.tasks import Named, TaskSpec
from polar.sandboxes.local import LocalRuntime
from tests.rollout.conftest import run_sessions
from tests.rollout.swebench_repos import build

KINDS = ("django", "pytest", "custom")  # unittest via a Django-style runner, pytest, a repo swebench does not know


@pytest.fixture(scope="module")
def instances(tmp_path_factory):
    root = tmp_path_factory.mktemp("swebench-repos")
    return {kind: build(root, kind) for kind in KINDS}


def task_for(inst, runtime: str = "local") -> TaskSpec:
    return TaskSpec(id=inst.row["instance_id"], instruction=inst.row["problem_statement"], repo=str(inst.repo_dir),
                    runtime=runtime, workdir="/testbed",
                    evaluator=Named(name="swebench", options={"instance": normalise(inst.row)}))


def official_verdict(instance: dict, log: str, tmp_path) -> tuple[str, dict]:
    """What swebench's own grading functions say on this log (its parser for the repo, its F2P/P2P rules)."""
    path = tmp_path / "test_output.txt"
    path.write_text(log)
    spec = swebench_spec(instance)
    status_map, found = get_logs_eval(spec, str(path))
    assert found, log[-2000:]
    report = get_eval_tests_report(status_map, {FAIL_TO_PASS: spec.FAIL_TO_PASS, PASS_TO_PASS: spec.PASS_TO_PASS})
    return get_resolution_status(report), report


EXPECTED = {  # patch → (reward, status, outcome of [test_add, test_mul, test_sub])
    "gold": (1.0, ResolvedStatus.FULL.value, ["PASSED", "PASSED", "PASSED"]),
    "empty": (0.0, ResolvedStatus.NO.value, ["FAILED", "FAILED", "PASSED"]),
    "partial": (0.0, ResolvedStatus.PARTIAL.value, ["PASSED", "FAILED", "PASSED"]),
}


@pytest.mark.parametrize("kind", KINDS)
def test_gold_empty_and_partial_patches_graded_as_swebench_grades(kind, instances, tmp_path):
    inst = instances[kind]
    instance = normalise(inst.row)
    runtime = LocalRuntime("http://127.0.0.1:9", "/dev/null", root=tmp_path)
    task = task_for(inst)
    for label, patch in (("gold", inst.gold), ("empty", ""), ("partial", inst.partial)):
        sandbox = clean_sandbox(task, runtime, f"{kind}-{label}", "/testbed")
        try:
            graded = grade(sandbox, instance, patch, env=env_for_tests(sandbox, sys.executable))
        finally:
            sandbox.stop()
        reward, status, outcomes = EXPECTED[label]
        assert (graded.reward, graded.status, graded.resolved) == (reward, status, reward == 1.0), graded.log[-3000:]
        tests = instance["FAIL_TO_PASS"] + instance["PASS_TO_PASS"]
        assert [graded.outcomes[t] for t in tests] == outcomes
        assert official_verdict(instance, graded.log, tmp_path) == (status, graded.report)


def test_a_patch_that_does_not_apply_and_an_unknown_repo(instances, tmp_path):
    inst = instances["pytest"]
    runtime = LocalRuntime("http://127.0.0.1:9", "/dev/null", root=tmp_path)
    sandbox = clean_sandbox(task_for(inst), runtime, "noapply", "/testbed")
    try:
        graded = grade(sandbox, normalise(inst.row), inst.gold.replace("a - b", "a ^ b"))
    finally:
        sandbox.stop()
    assert (graded.reward, graded.patch_applies, graded.status) == (0.0, False, "RESOLVED_NO")
    row = {**inst.row, "repo": "acme/unknown", "instance_id": "acme__unknown-1"}
    with pytest.raises(ValueError, match="needs test_cmd and log_parser"):
        swebench_spec(normalise(row))
    with pytest.raises(ValueError, match="unknown log_parser"):
        swebench_spec(normalise({**row, "test_cmd": "pytest", "log_parser": "parse_log_nonesuch"}))
    with pytest.raises(ValueError, match="missing test_patch"):
        normalise({k: v for k, v in inst.row.items() if k != "test_patch"})


def test_polar_evaluate_grades_a_patch_offline(instances, tmp_path):
    inst = instances["django"]
    task_file = tmp_path / "task.json"
    task_file.write_text(task_for(inst).model_dump_json())
    (tmp_path / "gold.diff").write_text(inst.gold)
    (tmp_path / "empty.diff").write_text("")
    runner = CliRunner()
    done = runner.invoke(main, ["evaluate", "--task", str(task_file), "--patch", str(tmp_path / "gold.diff"),
                                "--json", "--log", str(tmp_path / "log.txt")])
    assert done.exit_code == 0, done.output
    out = json.loads(done.output)
    assert (out["reward"], out["resolved"], out["status"]) == (1.0, True, "RESOLVED_FULL")
    assert set(out["outcomes"].values()) == {"PASSED"} and ">>>>> Start Test Output" in out["log"]
    assert (tmp_path / "log.txt").read_text() == out["log"]
    done = runner.invoke(main, ["evaluate", "--task", str(task_file), "--patch", str(tmp_path / "empty.diff")])
    assert done.exit_code == 1 and "reward 0.0, RESOLVED_NO" in done.output, done.output
    assert "FAIL_TO_PASS FAILED   test_add (calc_tests.test_ops.OpsTests.test_add)" in done.output
    task_file.write_text(task_for(inst).model_copy(update={"evaluator": Named(name="completed")}).model_dump_json())
    done = runner.invoke(main, ["evaluate", "--task", str(task_file), "--patch", str(tmp_path / "gold.diff")])
    assert done.exit_code != 0 and "polar evaluate grades 'swebench' tasks" in done.output


def test_a_rollout_session_fixing_the_instance_is_rewarded(stack, node_env, instances):
    """The python agent, driven by the scripted model, makes the gold fix in a real session; the
    swebench evaluator grades the session's diff."""
    inst = instances["pytest"]
    fix = [{"name": "edit_file", "arguments": {"path": "calc/ops.py", "old": f"def {f}(a, b):\n    return a {o} b",
                                               "new": f"def {f}(a, b):\n    return a {n} b"}}
           for f, o, n in (("add", "-", "+"), ("mul", "+", "*"))]
    stack.script(rules=[{"match": "make them add and multiply", "steps": [{"tool_calls": fix}, {"content": "Done."}]}])
    (result,) = run_sessions(node_env, [task_for(inst).model_copy(update={"harness": Named(name="python-agent")})])
    assert (result.outcome, result.reward) == ("ok", 1.0), result
    assert result.evaluation["status"] == "RESOLVED_FULL" and set(result.evaluation["outcomes"].values()) == {"PASSED"}
