"""The shipped tasks are sound: the reference patch solves each, the untouched repository does not."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from polar.harnesses import SessionContext
from polar.rollout.evaluators import EvalContext, make_evaluator
from polar.rollout.node import HarnessRun
from polar.rollout.tasks import load_tasks
from polar.sandboxes.local import LocalRuntime
from tests.rollout.conftest import TASKS


@pytest.mark.parametrize("task", load_tasks(TASKS / "tasks.jsonl"), ids=lambda t: t.id)
def test_reference_patch_solves_and_nothing_else_does(task, tmp_path):
    runtime = LocalRuntime("http://127.0.0.1:9", tmp_path / "unused-ca.pem", root=tmp_path)
    ctx = SessionContext(session_id=task.id, api_key="-", base_url="-", workdir="/work", model="-",
                         python=sys.executable)
    evaluator = make_evaluator(task.evaluator)
    scores = {}
    for name, diff in [("reference", (TASKS / task.metadata["reference_patch"]).read_text()), ("untouched", "")]:
        clean = evaluator.prepare(task, runtime, ctx)
        try:
            session = EvalContext(task, ctx, clean, runtime, HarnessRun(exit_code=0), diff, [], prepared=clean)
            evaluation = evaluator.evaluate(session)
        finally:
            evaluator.cleanup(clean)
        scores[name] = evaluation
    assert scores["reference"].reward == 1.0, scores["reference"].details
    untouched = scores["untouched"]
    assert untouched.reward == 0.0
    assert not any(untouched.details["fail_to_pass"].values()) and all(untouched.details["pass_to_pass"].values())
    assert not (Path(task.repo) / "tests" / "test_hidden.py").exists()  # hidden tests stay out of the repository
