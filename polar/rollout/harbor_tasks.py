"""Harbor task directories (the terminal-bench 2.0 format) as polar tasks, and their verifier as an evaluator.

A task directory, as Harbor's `TaskPaths` lays it out: `task.toml`, `instruction.md` (the prompt),
`environment/` (a Dockerfile; or `[environment].docker_image`), `tests/test.sh` (the verifier), `solution/`
(never used here). What polar reads of `task.toml`, by Harbor's `TaskConfig` field names: `[agent].timeout_sec`
(the session's deadline), `[verifier].timeout_sec` and `[verifier].env`, `[environment].docker_image`,
`[environment].build_timeout_sec`, `[environment].workdir`.

The verifier runs as Harbor's shared-mode verifier does: after the harness, in the session's own
container, `tests/` is copied to /tests (it is not there while the agent runs), `bash /tests/test.sh` runs
with its output in /logs/verifier/test-stdout.txt, and the reward is read from /logs/verifier/reward.json
(its `reward` value, or its only value) or else /logs/verifier/reward.txt (a number).

The `harbor` package itself is not a dependency: its releases require pydantic and cryptography versions
above the ones polar's gateway pins, so the format is read here by its documented field names.
"""

from __future__ import annotations

import json
import math
import re
import tempfile
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from polar.rollout.evaluators import EvalContext, Evaluation, Evaluator
from polar.rollout.tasks import Named, TaskSpec

TESTS_DIR, VERIFIER_DIR = "/tests", "/logs/verifier"


@dataclass
class HarborTask:
    path: Path
    name: str
    instruction: str
    config: dict[str, Any]
    dockerfile: Path | None
    docker_image: str | None
    tests: Path
    agent_timeout: float | None = None
    verifier_timeout: float = 600.0  # Harbor's default
    build_timeout: float = 600.0
    workdir: str | None = None
    verifier_env: dict[str, str] = field(default_factory=dict)


def read_task_dir(path: Path) -> HarborTask:
    """A Harbor task directory; a missing part is a ValueError naming it."""
    path = path.resolve()
    for need in ("task.toml", "instruction.md", "tests/test.sh"):
        if not (path / need).is_file():
            raise ValueError(f"{path}: not a Harbor task: no {need}")
    try:
        config = tomllib.loads((path / "task.toml").read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{path}/task.toml: {exc}") from None
    env, agent, verifier = (config.get(k) or {} for k in ("environment", "agent", "verifier"))
    dockerfile = path / "environment" / "Dockerfile"
    if not dockerfile.is_file() and not env.get("docker_image"):
        raise ValueError(f"{path}: no environment/Dockerfile and no [environment].docker_image")
    name = (config.get("metadata") or {}).get("name") or path.name
    return HarborTask(path=path, name=name, instruction=(path / "instruction.md").read_text(), config=config,
                      dockerfile=dockerfile if dockerfile.is_file() else None, docker_image=env.get("docker_image"),
                      tests=path / "tests", agent_timeout=agent.get("timeout_sec"),
                      verifier_timeout=float(verifier.get("timeout_sec", 600.0)),
                      build_timeout=float(env.get("build_timeout_sec", 600.0)), workdir=env.get("workdir"),
                      verifier_env={str(k): str(v) for k, v in (verifier.get("env") or {}).items()})


def task_id(name: str) -> str:
    """A polar task id from a Harbor task name (ids travel in URLs and sandbox names)."""
    return re.sub(r"[^A-Za-z0-9._:-]", "-", name).strip(".-")[:100] or "harbor-task"


def build_image(client: Any, task: HarborTask, network: str = "none") -> str:
    """The task's image: `docker_image` as it is, or environment/ built (tag polar-harbor/<id>). `network`:
    the build's network mode — "none" here; a user's Dockerfile usually fetches packages (give "default")."""
    import docker.errors

    if task.dockerfile is None:
        client.images.get(task.docker_image)  # ImageNotFound: said by the caller, per task
        return task.docker_image
    tag = f"polar-harbor/{task_id(task.name).lower()}:latest"
    try:
        client.images.build(path=str(task.dockerfile.parent), tag=tag, rm=True, forcerm=True, network_mode=network,
                            timeout=int(task.build_timeout))
    except docker.errors.BuildError as err:
        logs = "".join(chunk.get("stream", "") for chunk in err.build_log if isinstance(chunk, dict))
        raise RuntimeError(f"building {tag} failed: {err}\n{logs[-2000:]}") from None
    return tag


def image_workdir(client: Any, image: str) -> str | None:
    """The image's WORKDIR, unless it is / (a session snapshots its workdir with git)."""
    workdir = (client.images.get(image).attrs.get("Config") or {}).get("WorkingDir")
    return workdir if workdir and workdir != "/" else None


def to_task(task: HarborTask, image: str, workdir: str, harness: Named) -> TaskSpec:
    options = {"tests": str(task.tests), "timeout": task.verifier_timeout, "env": task.verifier_env}
    return TaskSpec(id=task_id(task.name), instruction=task.instruction, image=image, runtime="docker", workdir=workdir,
                    harness=harness, evaluator=Named(name="harbor", options=options),
                    timeout=float(task.agent_timeout or 600.0),
                    metadata={"source": "harbor", "name": task.name, "task_dir": str(task.path)})


class HarborVerifier(Evaluator):
    """options: tests (host dir, Harbor's tests/), timeout (seconds), env (the verifier's variables)."""

    name = "harbor"

    def evaluate(self, ctx: EvalContext) -> Evaluation:
        tests = self.options.get("tests")
        if not isinstance(tests, str) or not Path(tests, "test.sh").is_file():
            raise ValueError("harbor needs options.tests: a directory holding test.sh")
        sandbox = ctx.sandbox
        sandbox.exec(["sh", "-c", f"rm -rf {TESTS_DIR} && mkdir -p {VERIFIER_DIR}"], timeout=60)
        sandbox.copy_in(tests, TESTS_DIR)  # only now: the harness never saw them
        done = sandbox.exec(["sh", "-c", f"bash {TESTS_DIR}/test.sh > {VERIFIER_DIR}/test-stdout.txt 2>&1"],
                            env=self.options.get("env") or None, timeout=float(self.options.get("timeout", 600)))
        details: dict[str, Any] = {"exit_code": done.exit_code, "timed_out": done.timed_out}
        with tempfile.TemporaryDirectory() as tmp:
            try:
                sandbox.copy_out(VERIFIER_DIR, Path(tmp) / "verifier")
            except FileNotFoundError:
                raise RuntimeError(f"the verifier left no {VERIFIER_DIR}") from None
            out = Path(tmp) / "verifier"
            stdout = out / "test-stdout.txt"
            details["test_stdout"] = stdout.read_text(errors="replace")[-4000:] if stdout.is_file() else ""
            rewards = read_rewards(out)
        reward = rewards["reward"] if "reward" in rewards else next(iter(rewards.values()))
        return Evaluation(float(reward), details={**details, "rewards": rewards})


def read_rewards(verifier_dir: Path) -> dict[str, float]:
    """Harbor's reward files: reward.json (a number or name → number) first, else reward.txt."""
    as_json, as_text = verifier_dir / "reward.json", verifier_dir / "reward.txt"
    if as_json.is_file():
        data = json.loads(as_json.read_text())
        rewards = data if isinstance(data, dict) else {"reward": data}
    elif as_text.is_file():
        rewards = {"reward": float(as_text.read_text())}
    else:
        raise RuntimeError(f"the verifier wrote no reward ({VERIFIER_DIR}/reward.json or reward.txt)")
    for key, value in rewards.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise RuntimeError(f"reward {key!r} is not a finite number: {value!r}")
    if not rewards:
        raise RuntimeError("the verifier's reward.json is empty")
    return {k: float(v) for k, v in rewards.items()}
