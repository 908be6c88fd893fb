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
    from polar.runtime.base import RuntimeUnavailable
    from polar.runtime.docker_runtime import DockerRuntime, connect
    from polar.runtime.images import node_image
    from polar.transparent import add_listeners, remove_listeners, transparent_modes

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
