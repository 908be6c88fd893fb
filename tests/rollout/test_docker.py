"""A rollout session in a real container: transparent capture, attribution by container address."""

from __future__ import annotations

import os

import pytest

from polar.rollout.tasks import Named, TaskSpec
from tests.rollout.conftest import run_sessions

pytestmark = pytest.mark.docker

# Nothing in the container names polar: the call goes to the provider's own host over TLS.
CALL = ("curl -sS --fail-with-body https://api.openai.com/v1/chat/completions -H 'content-type: application/json' "
        """-d '{"model": "gpt-4o", "messages": [{"role": "user", "content": "hello from a container"}]}' > out.json""")


@pytest.fixture
def docker_env(stack, node_env):
    from polar.mitm.transparent import add_listeners, remove_listeners, transparent_modes
    from polar.sandboxes.base import RuntimeUnavailable
    from polar.sandboxes.docker_runtime import DockerRuntime, connect
    from polar.sandboxes.images import node_image

    try:
        client = connect()
    except RuntimeUnavailable as err:
        if os.environ.get("POLAR_REQUIRE_DOCKER") == "1":
            pytest.fail(f"POLAR_REQUIRE_DOCKER=1 but {err}")
        pytest.skip(str(err))
    runtime = DockerRuntime(client=client, addresses=stack.proxy.addon.gateway.registry)
    modes = transparent_modes(runtime.gateway_ip)
    add_listeners(modes)
    node_env.runtimes["docker"] = runtime
    node_env.polar_urls["docker"] = f"http://{runtime.gateway_ip}"
    node_env.ca_cert = str(node_env.runtimes["local"].ca_cert)
    try:
        yield node_env, node_image(client)
    finally:
        remove_listeners(modes)
        runtime.close()


def test_container_session_is_captured_and_scored(docker_env):
    env, image = docker_env
    check = Named(name="test_output", options={"command": "grep -q 'hello from a container' out.json"})
    task = TaskSpec(id="in-docker", instruction="x", runtime="docker", image=image, timeout=60,
                    harness=Named(name="shell", options={"script": CALL}), evaluator=check)
    (result,) = run_sessions(env, [task])
    assert (result.outcome, result.reward) == ("ok", 1.0), result
    (trajectory,) = result.trajectories
    assert len(trajectory.turns) == 1 and trajectory.trainable_tokens > 0


def test_harness_cannot_read_the_evaluation_material(docker_env, tmp_path):
    """Hidden tests exist only on the host until evaluation, and then only in the evaluator's own
    clean copy: a harness that searches its whole container finds nothing, yet the evaluation runs
    them (they pass only if the harness's search came back empty)."""
    env, _ = docker_env
    marker = "polar-hidden-material-7f3a"
    repo, hidden = tmp_path / "repo", tmp_path / "hidden" / "tests"
    repo.mkdir()
    (repo / "app.py").write_text("VALUE = 1\n")
    hidden.mkdir(parents=True)
    (hidden / "test_hidden.py").write_text(
        f"# {marker}\nfrom pathlib import Path\n\n\ndef test_harness_found_nothing():\n"
        "    assert Path('leak.txt').read_text().strip() == ''\n")
    search = (f"grep -rl --exclude-dir=proc --exclude-dir=sys --exclude-dir=dev '{marker}' / 2>/dev/null > /tmp/found;"
              " cp /tmp/found leak.txt")
    task = TaskSpec(id="clean-env", instruction="x", runtime="docker", repo=str(repo), timeout=120,
                    harness=Named(name="shell", options={"script": search}),
                    evaluator=Named(name="swe", options={"hidden": str(hidden.parent),
                                                        "fail_to_pass": ["tests/test_hidden.py::test_harness_found_nothing"]}))
    (result,) = run_sessions(env, [task], timeout=240)
    assert (result.outcome, result.reward) == ("ok", 1.0), result
