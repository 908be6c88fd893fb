"""NeMo Gym consumes polar's rollout service through polar's agent, the way NeMo Gym itself runs.

Real processes throughout: the scripted vLLM double (`polar double`), `polar rollout serve` (python
agent on the local runtime, SWE evaluator, the shipped tasks), and NeMo Gym 0.4.0 in its own venv
(scripts/setup_nemo_gym.sh): `ng_run` starts its head server, Ray and polar's agent server from the
shipped server dir (data/nemo_gym), and `ng_collect_rollouts` posts the rows to `/run` with
num_repeats=2, a GRPO group per task. The collected rollouts are checked against the rollout state
and the capture database, and against NeMo RL's contiguity rule.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import httpx
import pytest

from polar.capture.reader import CaptureReader
from polar.mitm.proxy import free_port
from polar.rollout.state import RolloutState

pytestmark = pytest.mark.slow  # outside scripts/test_fast: NeMo Gym's own venv and servers

REPO = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("POLAR_CACHE", Path.home() / ".cache" / "polar"))
VENV = CACHE / "nemo-gym-venv"
AGENT_CONFIG = "responses_api_agents/polar_agent/configs/polar_agent.yaml"
GROUP = 2  # NeMo Gym's num_repeats = the agent's group_size

# What the scripted model does: fix calc.py (reward 1), give up on textutil.py (reward 0).
SCRIPT = {"rules": [
    {"match": "calc.py", "steps": [
        {"reasoning": "found the bug", "tool_calls": [{"name": "edit_file", "arguments": {
            "path": "calc.py", "old": "(len(values) + 1)", "new": "len(values)"}}]},
        {"content": "Fixed."}]},
    {"match": "textutil.py", "steps": [{"reasoning": "not sure", "content": "I give up."}]},
]}


# A task the service cannot run: its sessions end in outcome "error", which NeMo Gym files as failures.
BROKEN_ROW = {"responses_create_params": {"input": [{"role": "user", "content": "x"}]},
              "polar_task": {"id": "no-runtime", "runtime": "nowhere"}}


def _required() -> bool:
    return "1" in (os.environ.get("POLAR_REQUIRE_NEMO_GYM"), os.environ.get("POLAR_REQUIRE_DOCKER"))


@pytest.fixture(scope="session")
def nemo_gym_venv() -> Path:
    """The NeMo Gym venv, built on first use and cached; the set-up time is printed."""
    started = time.monotonic()
    done = subprocess.run(["bash", str(REPO / "scripts" / "setup_nemo_gym.sh")], capture_output=True, text=True,
                          timeout=1200, check=False)
    if done.returncode != 0:
        message = f"scripts/setup_nemo_gym.sh failed:\n{(done.stdout + done.stderr)[-3000:]}"
        if _required():
            pytest.fail(message)
        pytest.skip(message)
    print(f"\nnemo-gym venv ready in {time.monotonic() - started:.1f}s: {done.stdout.strip().splitlines()[-1]}")
    return VENV


class Service:
    """A child process in its own session, logged to a file, stopped by its id."""

    def __init__(self, name: str, argv: list[str], log_dir: Path, cwd: Path | None = None, env: dict | None = None):
        self.name = name
        self.log = log_dir / f"{name}.log"
        with self.log.open("w") as out:
            self.proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                         start_new_session=True)

    def wait_until(self, url: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited {self.proc.returncode}:\n{self.tail()}")
            try:
                httpx.get(url, timeout=2)
                return
            except httpx.HTTPError:
                time.sleep(0.3)
        raise RuntimeError(f"{self.name} did not answer at {url} within {timeout:.0f}s:\n{self.tail()}")

    def tail(self) -> str:
        return self.log.read_text()[-4000:]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)  # lets ng_run stop its servers and Ray
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                pass
        try:  # whatever it left behind in its session (the process group it leads)
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()


@pytest.fixture
def services(tmp_path):
    started: list[Service] = []

    def start(*args, **kw) -> Service:
        started.append(Service(*args, log_dir=tmp_path, **kw))
        return started[-1]

    yield start
    for service in reversed(started):
        service.stop()


def polar_stack(start, tokenizer_dir: Path, work: Path) -> str:
    """The scripted double and `polar rollout serve` in front of it; the rollout API's URL."""
    script = work / "script.json"
    script.write_text(json.dumps(SCRIPT))
    double_port, api_port = free_port(), free_port()
    double = start("double", [sys.executable, "-m", "polar.cli", "double", "--tokenizer", str(tokenizer_dir),
                              "--script", str(script), "--port", str(double_port)])
    double.wait_until(f"http://127.0.0.1:{double_port}/health", 60)
    serve = start("rollout-serve", [
        sys.executable, "-m", "polar.cli", "rollout", "serve", "--port", str(api_port),
        "--upstream", f"http://127.0.0.1:{double_port}", "--tokenizer", str(tokenizer_dir),
        "--db", str(work / "captures.db"), "--state", str(work / "rollout.db"),
        "--proxy-port", str(free_port()), "--running", "4"], cwd=work)
    serve.wait_until(f"http://127.0.0.1:{api_port}/health", 60)
    return f"http://127.0.0.1:{api_port}"


def nemo_gym_env(venv: Path) -> dict[str, str]:
    """The environment NeMo Gym's commands run in: its venv first, none of the test's."""
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env['PATH']}"
    return env


def test_nemo_gym_collects_scored_polar_rollouts(nemo_gym_venv, tokenizer_dir, tmp_path, services):
    work = tmp_path / "polar"
    work.mkdir()
    rollout_url = polar_stack(services, tokenizer_dir, work)

    # NeMo Gym's working dir: polar's server dir, its venv the one the set-up script built.
    gym = tmp_path / "gym"
    shutil.copytree(REPO / "data" / "nemo_gym", gym)
    (gym / "responses_api_agents" / "polar_agent" / ".venv").symlink_to(nemo_gym_venv)
    env = nemo_gym_env(nemo_gym_venv)
    head = f"+head_server={{host:127.0.0.1,port:{free_port()}}}"
    agent_port = free_port()
    agent = "+polar_agent.responses_api_agents.polar_agent"
    ng_run = services("ng_run", [
        str(nemo_gym_venv / "bin" / "ng_run"), f"+config_paths=[{AGENT_CONFIG}]", "+skip_venv_if_present=true",
        head, f"{agent}.port={agent_port}", f"{agent}.rollout_url={rollout_url}",
        f"{agent}.group_size={GROUP}", f"{agent}.tokenizer={tokenizer_dir}"], cwd=gym, env=env)
    agent_url = f"http://127.0.0.1:{agent_port}"
    ng_run.wait_until(agent_url, 180)

    rows = gym / "rows.jsonl"
    with rows.open("w") as out:
        subprocess.run([str(nemo_gym_venv / "bin" / "python"), "-m", "polar.adapters.nemo_gym", "rows",
                        str(REPO / "data" / "tasks" / "tasks.jsonl")], stdout=out, env=env, check=True)
        out.write(json.dumps(BROKEN_ROW) + "\n")
    collected = gym / "rollouts.jsonl"
    collect = subprocess.run([
        str(nemo_gym_venv / "bin" / "ng_collect_rollouts"), "+agent_name=polar_agent",
        f"+input_jsonl_fpath={rows}", f"+output_jsonl_fpath={collected}", f"+num_repeats={GROUP}",
        "+upload_rollouts_to_wandb=false", head], cwd=gym, env=env, capture_output=True, text=True, timeout=300,
        check=False)
    assert collect.returncode == 0, (collect.stdout + collect.stderr)[-4000:] + ng_run.tail()

    rollouts = [json.loads(line) for line in collected.read_text().splitlines()]
    results = {r.session_id: r for r in RolloutState(work / "rollout.db").all_results()}
    store = CaptureReader(work / "captures.db")
    assert len(rollouts) == 2 * GROUP and len(results) == 3 * GROUP
    for rollout in rollouts:
        result = results[rollout["polar_session_id"]]
        assert rollout["reward"] == result.reward and rollout["polar_outcome"] == result.outcome == "ok"
        (trajectory,) = [t for t in result.trajectories if t.id == rollout["polar_trajectory_id"]]
        items = rollout["response"]["output"]
        assert all("generation_token_ids" in item for item in items) and len(items) == len(trajectory.turns)
        captured = {row["call_id"]: row for row in store.calls(session=result.session_id)}
        seen: list[int] = []
        for item, turn in zip(items, trajectory.turns, strict=True):
            call = captured[turn.call_id]  # token for token what polar sent and vLLM sampled
            assert item["prompt_token_ids"] == call["prompt_ids"] == trajectory.token_ids[:turn.completion_start]
            assert item["generation_token_ids"] == call["completion_ids"]
            assert item["generation_log_probs"] == call["completion_logprobs"]
            assert item["generation_log_probs"] == trajectory.logprobs[turn.completion_start:turn.completion_end]
            assert item["prompt_token_ids"][:len(seen)] == seen  # NeMo RL: each prompt extends what came before
            seen = item["prompt_token_ids"] + item["generation_token_ids"]
        assert "<tool_call>" in items[0]["content"][0]["text"] or "I give up." in items[0]["content"][0]["text"]

    # Each row came back as a complete GRPO group: its samples are the sessions of one polar task.
    groups = defaultdict(list)
    for rollout in rollouts:
        groups[rollout["polar_task"]["id"]].append(rollout)
    assert sorted(groups) == ["calc-mean", "textutil-slugify"]
    for name, group in groups.items():
        assert sorted(r["_ng_rollout_index"] for r in group) == list(range(GROUP))
        (task_id,) = {r["polar_task_id"] for r in group}
        assert {r["polar_session_id"] for r in group} == {s for s, r in results.items() if r.task_id == task_id}
        assert [r["reward"] for r in group] == [1.0 if name == "calc-mean" else 0.0] * GROUP
    assert [len(r["response"]["output"]) for r in groups["calc-mean"]] == [2] * GROUP  # tool call, then answer
    # Delivered results are drained on the service: a second consumer would not get them again.
    assert RolloutState(work / "rollout.db").results(undrained_only=True) == []

    # Sessions that failed come back as NeMo Gym failures, with polar's reason and nothing to train on.
    failures = [json.loads(line) for line in (gym / "rollouts_failures.jsonl").read_text().splitlines()]
    assert len(failures) == GROUP
    for failure in failures:
        result = results[failure["polar_session_id"]]
        assert (failure["polar_outcome"], failure["_ng_failure_class"]) == ("error", "transient")
        assert failure["reward"] is None  # no reward: not a 0.0 the trainer would learn from
        assert "runtime 'nowhere' is not available" in failure["polar_error"] == result.error
        (note,) = failure["response"]["output"]
        assert "generation_token_ids" not in note and "without a model call" in note["content"][0]["text"]

    # /v1/responses: a one-off rollout of the input, the response alone.
    answer = httpx.post(f"{agent_url}/v1/responses", json={"input": "say hello"}, timeout=120)
    assert answer.status_code == 200, answer.text
    (item,) = answer.json()["output"]
    assert "say hello" in item["content"][0]["text"] and item["generation_token_ids"]

    # A row that names no task is refused with the reason, not run.
    refused = httpx.post(f"{agent_url}/run", json={"responses_create_params": {"input": []}}, timeout=30)
    assert refused.status_code == 400 and "names no instruction" in refused.text


def test_polar_never_imports_nemo_gym():
    """The adapter is the only module that imports nemo_gym; polar and its CLI load without it."""
    code = ("import sys, polar.cli, polar.adapters, polar.adapters.rollout_link; "
            "sys.exit('nemo_gym' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


# verify_response on results with and without a reward, run in the NeMo Gym venv (the adapter imports nemo_gym).
VERIFY = """
import json, sys
from polar.adapters.nemo_gym import PolarRunRequest, verify_response
from polar.rollout.tasks import SessionResult

row = PolarRunRequest.model_validate({"responses_create_params": {"input": "fix it"}})
out = {}
for name, fields in json.loads(sys.argv[1]).items():
    result = SessionResult(session_id="s." + name, task_id="t", sample=0, **fields)
    out[name] = verify_response(row, result, lambda ids: "")
print(json.dumps(out))
"""


def test_a_missing_reward_is_a_failure_not_zero(nemo_gym_venv):
    cases = {"scored_zero": {"outcome": "ok", "reward": 0.0},
             "unscored": {"outcome": "ok"},
             "unscored_timeout": {"outcome": "timeout", "partial": True},
             "evaluator_failed": {"outcome": "error", "error": "evaluator swe: boom"},
             "no_logprobs": {"outcome": "ok", "reward": 1.0, "trajectories": [_trajectory_without_logprobs()]}}
    env = {**nemo_gym_env(nemo_gym_venv), "PYTHONPATH": str(REPO)}  # this checkout's adapter
    done = subprocess.run([str(nemo_gym_venv / "bin" / "python"), "-c", VERIFY, json.dumps(cases)], env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout)
    assert got["scored_zero"]["reward"] == 0.0 and "_ng_failure_class" not in got["scored_zero"]  # a real 0.0
    for name in ("unscored", "unscored_timeout", "evaluator_failed"):
        assert got[name]["reward"] is None and got[name]["_ng_failure_class"] == "transient", got[name]
    assert "without a reward" in got["unscored"]["polar_error"]
    assert got["evaluator_failed"]["polar_error"] == "evaluator swe: boom"
    # A trajectory whose calls came back without logprobs: a failure with the reason, never invented numbers.
    no_lp = got["no_logprobs"]
    assert no_lp["_ng_failure_class"] == "transient" and "no logprobs for 1 of the trajectory's 2 calls" in no_lp["polar_error"]
    (note,) = no_lp["response"]["output"]
    assert "generation_log_probs" not in note and "nothing to train on" in note["content"][0]["text"]


def _trajectory_without_logprobs() -> dict:
    turns = [{"row_id": 1, "call_id": "a", "prompt_start": 0, "completion_start": 2, "completion_end": 4},
             {"row_id": 2, "call_id": "b", "prompt_start": 0, "completion_start": 5, "completion_end": 7,
              "has_logprobs": False}]
    return {"id": "s#1", "builder": "prefix-merge", "session_id": "s", "token_ids": [1, 2, 3, 4, 5, 6, 7],
            "loss_mask": [0, 0, 1, 1, 0, 1, 1], "logprobs": [0.0, 0.0, -0.5, -0.25, 0.0, None, None], "turns": turns}
