"""Harbor task directories imported (`polar tasks import --format harbor`) and run through the rollout
service in their own built image: the instruction as the prompt, tests/ absent while the harness runs and
run after it, the reward from the verifier's own reward file, the task's timeouts on the task."""

from __future__ import annotations

import asyncio
import json

import pytest
from click.testing import CliRunner

from polar.cli import main
from polar.rollout.harbor_tasks import read_rewards
from polar.rollout.lifecycle import SessionPhases
from polar.rollout.node import GatewayNode, NodeConfig
from polar.rollout.service import LocalNode, RolloutService
from polar.rollout.state import RolloutState
from polar.rollout.tasks import Named, load_tasks
from tests.rollout.conftest import first_results
from tests.rollout.test_docker import docker_env  # noqa: F401  (the fixture)

# The agent: notes whether it can see the tests, and writes the greeting only when asked for "hello".
AGENT = ('if [ -e /tests ]; then echo yes > saw_tests; else echo no > saw_tests; fi; '
         'case "$1" in *hello*) echo hello > greeting.txt;; *) echo hi > greeting.txt;; esac')
TEST_TXT = ('[ "$(cat /app/greeting.txt)" = "$WANT" ] && [ "$(cat /app/saw_tests)" = no ] '
            '&& echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt\n')
TEST_JSON = ('ok=0; [ "$(cat /app/greeting.txt)" = "$WANT" ] && ok=1\n'
             'echo "{\\"reward\\": $ok, \\"saw_tests\\": 0}" > /logs/verifier/reward.json\n')


def harbor_task(root, name, instruction, test_sh, want, parent):
    d = root / name
    (d / "environment").mkdir(parents=True)
    (d / "tests").mkdir()
    (d / "solution").mkdir()
    (d / "instruction.md").write_text(instruction)
    (d / "task.toml").write_text(f'version = "1.0"\n\n[metadata]\nname = "{name}"\n\n[agent]\ntimeout_sec = 60.0\n\n'
                                 f'[verifier]\ntimeout_sec = 30.0\n\n[verifier.env]\nWANT = "{want}"\n\n'
                                 '[environment]\nbuild_timeout_sec = 120.0\n')
    (d / "environment" / "Dockerfile").write_text(f"FROM {parent}\nRUN mkdir -p /app\nWORKDIR /app\n")
    (d / "tests" / "test.sh").write_text("#!/bin/bash\n" + test_sh)
    (d / "solution" / "solve.sh").write_text("echo hello > /app/greeting.txt\n")
    return d


def test_reward_files(tmp_path):
    (tmp_path / "reward.txt").write_text("0.5\n")
    assert read_rewards(tmp_path) == {"reward": 0.5}
    (tmp_path / "reward.json").write_text('{"reward": 1, "style": 0.25}')  # json first, as Harbor reads them
    assert read_rewards(tmp_path) == {"reward": 1.0, "style": 0.25}
    (tmp_path / "reward.json").write_text('{"reward": "NaN"}')
    with pytest.raises(RuntimeError, match="not a finite number"):
        read_rewards(tmp_path)


@pytest.mark.docker
def test_harbor_tasks_run_through_the_rollout_service(docker_env, tmp_path):  # noqa: F811
    from polar.rollout.swe_image import swe_image
    from polar.sandboxes.docker_runtime import connect
    from polar.sandboxes.images import node_image

    env, _ = docker_env
    client = connect()
    parent = swe_image(client, node_image(client))
    solved = harbor_task(tmp_path, "say-hello", "Write hello to greeting.txt.", TEST_TXT, "hello", parent)
    unsolved = harbor_task(tmp_path, "say-goodbye", "Write goodbye to greeting.txt.", TEST_JSON, "goodbye", parent)
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "task.toml").write_text("")
    done = CliRunner().invoke(main, ["tasks", "import", "--format", "harbor", str(solved), str(unsolved),
                                     str(tmp_path / "broken"), "--out", str(tmp_path / "tasks.jsonl")])
    assert done.exit_code == 1 and "imported 2 of 3" in done.output, done.output
    assert "broken: error: ValueError:" in done.output and "no instruction.md" in done.output
    tasks = {t.id: t for t in load_tasks(tmp_path / "tasks.jsonl")}
    assert set(tasks) == {"say-hello", "say-goodbye"}
    hello = tasks["say-hello"]
    assert (hello.instruction, hello.workdir, hello.timeout, hello.runtime) == (
        "Write hello to greeting.txt.", "/app", 60.0, "docker")
    assert hello.evaluator.options["timeout"] == 30.0 and hello.evaluator.options["env"] == {"WANT": "hello"}
    shell = Named(name="shell", options={"script": AGENT})
    runs = [t.model_copy(update={"harness": shell}) for t in tasks.values()]

    async def run():
        config = NodeConfig(running_slots=2)
        node = LocalNode(GatewayNode(SessionPhases(env, config), config), env.capture_db)
        service = RolloutService(RolloutState(tmp_path / "rollout.db"), [node])
        await service.start()
        try:
            await service.submit(runs)
            return await first_results(service, 2, timeout=240)
        finally:
            await service.close()

    results = {r.task_id: r for r in asyncio.run(run())}
    assert (results["say-hello"].outcome, results["say-hello"].reward) == ("ok", 1.0), results["say-hello"]
    goodbye = results["say-goodbye"]
    assert (goodbye.outcome, goodbye.reward, goodbye.evaluation["rewards"]) == (
        "ok", 0.0, {"reward": 0.0, "saw_tests": 0.0}), goodbye
    assert json.dumps(goodbye.evaluation)  # the verifier's details persist as JSON
