"""The README's main job: the shipped tasks, a real CLI in Docker, the scripted upstream, scored
trajectories in SQLite and a printed summary.

The run itself is the session fixture `main_job` (tests/conftest.py), shared with the export and
report tests.
"""

from __future__ import annotations

import pytest

from polar.capture.reader import CaptureReader
from polar.cli.demo import TASKS, demo_tasks, scripted_rule
from polar.harnesses import get
from polar.rollout.state import RolloutState

pytestmark = pytest.mark.docker


def test_main_job_scores_every_session(main_job):
    harness, samples, output = main_job.harness, main_job.samples, main_job.output
    tasks = demo_tasks(TASKS, harness, "docker", samples)
    state = RolloutState(main_job.state)
    try:
        results = state.all_results()
        assert not state.unfinished()
    finally:
        state.close()
    assert sorted(r.task_id for r in results) == sorted(t.id for t in tasks for _ in range(samples))
    for r in results:
        assert (r.outcome, r.reward, r.harness_exit) == ("ok", 1.0, 0), r
        assert all(r.evaluation["fail_to_pass"].values()) and all(r.evaluation["pass_to_pass"].values())
        assert r.trajectories and all(t.reward == 1.0 and t.trainable_tokens > 0 for t in r.trajectories)

    # Each scripted step is one model call the CLI has to make: all of them are in the capture store,
    # under the session, answered by polar in the CLI's own provider format.
    steps = {t.id: len(scripted_rule(t, get(harness))["steps"]) for t in tasks}
    markers = {t.id: t.metadata["scripted"]["marker"].encode() for t in tasks}
    store = CaptureReader(main_job.captures)
    for r in results:
        rows = [row for row in store.calls(session=r.session_id, with_tokens=False)
                if row["endpoint"] not in ("unknown", "count_tokens", "models")]
        assert len(rows) == steps[r.task_id], [(row["path"], row["status"]) for row in rows]
        assert {(row["provider"], row["status"]) for row in rows} == {(get(harness).provider, "ok")}
        assert all(markers[r.task_id] in row["request_body"] for row in rows)

    assert "main job: scored trajectories" in output
    for t in tasks:
        assert t.id in output
