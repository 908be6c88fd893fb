"""The README's main job: the shipped tasks, a real CLI in Docker, the scripted upstream, scored
trajectories in SQLite and a printed summary.

The demo runs in a child process: it starts its own polar proxy, and mitmproxy allows one per
process (this test process may already hold the shared `stack` one).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from polar.capture.store import CaptureStore
from polar.demo import TASKS, demo_tasks, scripted_rule
from polar.harnesses import get
from polar.rollout.state import RolloutState

pytestmark = pytest.mark.docker

HARNESS = "claude_code"  # the default of `polar demo`, and the fastest CLI to start
SAMPLES = 2


@pytest.fixture(scope="module")
def docker_ready():
    from polar.runtime.base import RuntimeUnavailable
    from polar.runtime.docker_runtime import connect

    try:
        connect().close()
    except RuntimeUnavailable as err:
        if os.environ.get("POLAR_REQUIRE_DOCKER") == "1":
            pytest.fail(f"POLAR_REQUIRE_DOCKER=1 but {err}")
        pytest.skip(str(err))


def test_main_job_scores_every_session(docker_ready, tokenizer_dir, tmp_path):
    argv = [sys.executable, "-m", "polar.demo", "--harness", HARNESS, "--samples", str(SAMPLES),
            "--workdir", str(tmp_path), "--tokenizer", str(tokenizer_dir)]
    done = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=900, env={**os.environ, "COLUMNS": "160"})
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]

    tasks = demo_tasks(TASKS, HARNESS, "docker", SAMPLES)
    state = RolloutState(tmp_path / "rollout.db")
    try:
        results = state.all_results()
        assert not state.unfinished()
    finally:
        state.close()
    assert sorted(r.task_id for r in results) == sorted(t.id for t in tasks for _ in range(SAMPLES))
    for r in results:
        assert (r.outcome, r.reward, r.harness_exit) == ("ok", 1.0, 0), r
        assert all(r.evaluation["fail_to_pass"].values()) and all(r.evaluation["pass_to_pass"].values())
        assert r.trajectories and all(t.reward == 1.0 and t.trainable_tokens > 0 for t in r.trajectories)

    # Each scripted step is one model call the CLI has to make: all of them are in the capture store,
    # under the session, answered by polar in the CLI's own provider format.
    steps = {t.id: len(scripted_rule(t, get(HARNESS))["steps"]) for t in tasks}
    markers = {t.id: t.metadata["scripted"]["marker"].encode() for t in tasks}
    store = CaptureStore(tmp_path / "captures.db", readonly=True)
    try:
        for r in results:
            rows = [row for row in store.calls(session=r.session_id, with_tokens=False)
                    if row["endpoint"] not in ("unknown", "count_tokens", "models")]
            assert len(rows) == steps[r.task_id], [(row["path"], row["status"]) for row in rows]
            assert {(row["provider"], row["status"]) for row in rows} == {(get(HARNESS).provider, "ok")}
            assert all(markers[r.task_id] in row["request_body"] for row in rows)
    finally:
        store.close()

    assert "main job: scored trajectories" in output
    for t in tasks:
        assert t.id in output
