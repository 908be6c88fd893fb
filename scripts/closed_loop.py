"""A closed RL loop on one CPU machine: polar's rollout service samples, a learner trains, vLLM reloads.

    .venv/bin/python scripts/closed_loop.py --steps 30 --out runs/loop   # starts its own vLLM on the tiny model
    .venv/bin/python scripts/closed_loop.py --vllm-url URL ...           # or uses one you started (see below)

Run it with polar's Python; docs/closed_loop.md has a full run and its figures. Each step:

  1. submits G tasks of S samples each (GRPO groups) to `polar rollout serve`, started here:
     token-faithful in front of vLLM, with --max-staleness K;
  2. takes the groups back with `polar.datasets.stream_rl_groups` (group-relative advantages);
  3. hands their rows to the learner, scripts/closed_loop_learner.py in the vLLM venv (the Python
     with torch), which takes one clipped policy-gradient step and writes OUT/weights/vNNNN;
  4. `RolloutClient.update_policy`: polar pauses and drains, vLLM reloads the weights in place
     (POST /collective_rpc reload_weights: polar/upstream/vllm_weights.py says why that API),
     polar resumes under the new policy version;
  5. reads a fixed prompt's logprobs through vLLM (they move when the weights do);

and prints one line per step, also appended to OUT/steps.jsonl. At the end it writes OUT/report.html
(`polar report`: the reward per policy version is the learning curve).

A vLLM given with --vllm-url must run with VLLM_SERVER_DEV_MODE=1 and
`--worker-extension-cls polar.upstream.vllm_extension.WeightReload` (polar on its PYTHONPATH); the
loop says so and stops if it does not. It loads the model's own weights first (version 0).

The toy task, said plainly: it measures nothing about language. The shell harness asks the model
one question through polar with the OpenAI SDK and keeps the answer; the reward is brevity,
1 - completion_tokens / max_tokens. The tiny random-weight model ends its turns after tens to
hundreds of tokens, so rewards spread within every group, and the policy raises them by ending
its turn sooner (a larger logit for <|im_end|>).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

from polar.datasets import group_sizes, stream_rl_groups
from polar.rollout.client import RolloutClient
from polar.rollout.tasks import Named, TaskSpec
from polar.upstream.vllm_extension import EXTENSION
from polar.upstream.vllm_weights import VLLMWeights

REPO = Path(__file__).resolve().parents[1]
CACHE = Path(os.environ.get("POLAR_CACHE") or Path.home() / ".cache" / "polar")
SERVED_MODEL = "polar-tiny"

# The harness: one chat call through polar (base URL and session key come from the rollout session).
TOY_CLIENT = """
import json, os, sys
import openai
reply = openai.OpenAI(max_retries=0, timeout=600).chat.completions.create(
    model=os.environ["POLAR_MODEL"], max_tokens=int(os.environ["TOY_MAX_TOKENS"]),
    messages=[{"role": "user", "content": sys.argv[1]}])
choice = reply.choices[0]
with open("answer.json", "w") as f:
    json.dump({"content": choice.message.content or "", "finish_reason": choice.finish_reason,
               "completion_tokens": reply.usage.completion_tokens}, f)
"""
# The evaluator: scored from what the harness kept (test_output, parse json: the last line is the reward).
TOY_REWARD = """
import json
answer = json.load(open("answer.json"))
n = answer["completion_tokens"]
print(json.dumps({"reward": round(1 - min(n, {max_tokens}) / {max_tokens}, 4), "completion_tokens": n,
                  "finish_reason": answer["finish_reason"]}))
"""
INSTRUCTION = "Answer in as few words as you can: what is the capital of France?"
# Teacher-forced through vLLM after each update: the logprob of each of its tokens under the served weights.
PROBE = ("<|im_start|>user\n" + INSTRUCTION + "<|im_end|>\n<|im_start|>assistant\n<think>\nThe capital of France "
         "is Paris.\n</think>\n\nParis.<|im_end|>\n")


def toy_task(task_id: str, samples: int, max_tokens: int, timeout: float, policy_version: int | None = None) -> TaskSpec:
    harness = Named(name="shell", options={"script": '{python} -c "$TOY_CLIENT" "$1"',
                                           "variables": {"TOY_CLIENT": TOY_CLIENT, "TOY_MAX_TOKENS": str(max_tokens)}})
    reward = TOY_REWARD.replace("{max_tokens}", str(max_tokens))
    evaluator = Named(name="test_output", options={"command": "{python} -c " + shlex.quote(reward), "parse": "json"})
    return TaskSpec(id=task_id, instruction=INSTRUCTION, harness=harness, evaluator=evaluator, samples=samples,
                    timeout=timeout, policy_version=policy_version, metadata={"toy": "brevity", "max_tokens": max_tokens})


@dataclass
class LoopConfig:
    out: Path
    steps: int = 3
    groups: int = 4  # tasks per step
    group_size: int = 4  # samples per task
    max_tokens: int = 256
    lr: float = 3e-4
    clip: float = 0.2
    max_staleness: int = 1
    running: int = 4  # sessions sampling at once
    model: Path = CACHE / "models" / "qwen35-tiny"
    vllm_url: str | None = None  # None: start one (dev mode) and stop it at the end
    vllm_python: Path = CACHE / "vllm-venv" / "bin" / "python"
    session_timeout: float = 300.0
    report: bool = True


@dataclass
class StepRecord:
    step: int
    version: int  # the policy version after this step
    sampled_under: int
    sessions: int
    outcomes: dict[str, int]
    reward_mean: float | None
    reward_std: float | None
    groups_with_signal: int
    sampled_tokens: int
    rollout_s: float
    learner: dict[str, Any] | None = None
    sync: dict[str, Any] | None = None
    probe_mean: float | None = None
    probe_max_change: float | None = None  # vs the probe before this step
    seconds: float = 0.0
    note: str = ""


def vllm_env(log: Path) -> dict[str, str]:
    """What scripts/serve_vllm_cpu.sh needs to serve a vLLM the loop can update: the dev endpoints, and
    polar's worker extension (polar/upstream/vllm_extension.py) importable by vLLM's Python."""
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    args = f"{os.environ.get('POLAR_VLLM_ARGS', '')} --worker-extension-cls {EXTENSION}".strip()
    return {"VLLM_SERVER_DEV_MODE": "1", "PYTHONPATH": path, "POLAR_VLLM_ARGS": args, "POLAR_SERVED_MODEL": SERVED_MODEL,
            "POLAR_MAX_MODEL_LEN": "4096", "POLAR_VLLM_LOG": str(log)}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return f"(no {path})"


def stop_group(proc: subprocess.Popen | int, grace: float = 30.0) -> None:
    """SIGTERM a process group we started, SIGKILL it if it lingers."""
    pid = proc if isinstance(proc, int) else proc.pid
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        try:
            os.killpg(pid, 0)
        except ProcessLookupError:
            return
        if not isinstance(proc, int) and proc.poll() is not None:
            return
        time.sleep(0.2)
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


class LearnerProcess:
    """scripts/closed_loop_learner.py under the vLLM venv's Python, spoken to in JSON lines."""

    def __init__(self, config: LoopConfig):
        if not config.vllm_python.exists():
            raise SystemExit(f"no vLLM venv Python at {config.vllm_python} (torch lives there): "
                             "run scripts/setup_vllm_cpu.sh")
        self.log = config.out / "learner.log"
        argv = [str(config.vllm_python), str(REPO / "scripts" / "closed_loop_learner.py"), "--model", str(config.model),
                "--lr", str(config.lr), "--clip", str(config.clip)]
        # Idle OpenMP threads sleep instead of spinning: vLLM samples on the same cores between steps.
        env = os.environ | {"OMP_WAIT_POLICY": "PASSIVE"}
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
                                     stderr=self.log.open("w"), start_new_session=True)
        self.ready = self._read()

    def _read(self) -> dict[str, Any]:
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the learner exited (code {self.proc.wait()}); {self.log}:\n{tail(self.log)}")
        return json.loads(line)

    def step(self, rows: list[dict[str, Any]], out: Path) -> dict[str, Any]:
        keep = ("input_ids", "loss_mask", "logprobs", "advantage")
        request = {"op": "step", "out": str(out), "rows": [{k: r[k] for k in keep} for r in rows]}
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        answer = self._read()
        if not answer.get("ok"):
            raise RuntimeError(f"the learner failed: {answer.get('error')} (log: {self.log})")
        return answer

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write('{"op": "quit"}\n')
                self.proc.stdin.flush()
                self.proc.wait(30)
            except (OSError, subprocess.TimeoutExpired):
                stop_group(self.proc)


class ClosedLoop:
    def __init__(self, config: LoopConfig):
        self.config = config
        self.run_id = time.strftime("loop-%Y%m%d-%H%M%S")
        self.version = 0
        self.steps: list[StepRecord] = []
        self.last_probe: list[float] | None = None
        self._vllm_pid: int | None = None
        self._rollout: subprocess.Popen | None = None
        self.learner: LearnerProcess | None = None
        self.client: RolloutClient | None = None
        self.vllm: VLLMWeights | None = None
        self.vllm_url = config.vllm_url

    # -- start and stop -----------------------------------------------------------------------------

    def start(self) -> None:
        c = self.config
        c.out.mkdir(parents=True, exist_ok=True)
        if (c.out / "rollout.db").exists():
            raise SystemExit(f"{c.out} already holds a run (rollout.db): give a fresh --out")
        if not (c.model / "config.json").is_file():
            raise SystemExit(f"no model at {c.model}: run scripts/build_tiny_model.py")
        if self.vllm_url is None:
            self.vllm_url = self._start_vllm()
        self.vllm = VLLMWeights(self.vllm_url)
        self.vllm.check()  # says what is missing (dev mode) before anything else starts
        # A reused server may hold weights of an earlier run: every run starts from the model itself.
        self.vllm.load(c.model, 0)
        self.learner = LearnerProcess(c)
        self._start_rollout()
        self.client.resume(policy_version=0)
        self.last_probe = self.probe()
        say(f"run {self.run_id}: vLLM {self.vllm_url} (weights version {self.vllm.version()}), rollout "
            f"{self.client.url}, learner {self.learner.ready['parameters']:,} parameters; out {c.out}")

    def _start_vllm(self) -> str:
        port = free_port()
        env = os.environ | vllm_env(self.config.out / "vllm.log")
        say(f"starting vLLM (dev mode, polar's worker extension) on port {port}: about a minute")
        done = subprocess.run(["bash", str(REPO / "scripts" / "serve_vllm_cpu.sh"), str(port), str(self.config.model)],
                              capture_output=True, text=True, env=env, check=False)
        if done.returncode != 0:
            raise SystemExit(f"vLLM did not start:\n{done.stdout}\n{done.stderr}")
        self._vllm_pid = int(done.stdout.split()[-1])
        return f"http://127.0.0.1:{port}"

    def _start_rollout(self) -> None:
        c = self.config
        port = free_port()
        argv = [sys.executable, "-m", "polar.cli", "rollout", "serve", "--port", str(port),
                "--proxy-port", str(free_port()), "--state", str(c.out / "rollout.db"), "--db", str(c.out / "captures.db"),
                "--upstream", self.vllm_url, "--upstream-model", SERVED_MODEL, "--tokenizer", str(c.model),
                "--max-staleness", str(c.max_staleness), "--running", str(c.running), "--ready", str(c.running)]
        log = c.out / "rollout.log"
        self._rollout = subprocess.Popen(argv, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)
        self.client = RolloutClient(f"http://127.0.0.1:{port}")
        deadline = time.monotonic() + 120
        while not self.client.health():
            if self._rollout.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"polar rollout serve did not come up; {log}:\n{tail(log)}")
            time.sleep(0.5)

    def close(self) -> None:
        if self.learner:
            self.learner.close()
        if self.client:
            self.client.close()
        if self._rollout:
            stop_group(self._rollout)
        if self.vllm:
            self.vllm.close()
        if self._vllm_pid:
            stop_group(self._vllm_pid)

    # -- one step -------------------------------------------------------------------------------------

    def probe(self) -> list[float]:
        """The fixed prompt's per-token logprobs under the weights vLLM serves now (greedy, not captured)."""
        body = {"model": SERVED_MODEL, "prompt": PROBE, "max_tokens": 1, "temperature": 0, "prompt_logprobs": 0}
        reply = httpx.post(f"{self.vllm_url}/v1/completions", json=body, timeout=120)
        reply.raise_for_status()
        entries = reply.json()["choices"][0]["prompt_logprobs"]
        return [next(iter(e.values()))["logprob"] for e in entries if e]

    def step(self) -> StepRecord:
        c, n = self.config, len(self.steps) + 1
        t0 = time.monotonic()
        tasks = [toy_task(f"{self.run_id}-s{n:03d}-g{i}", c.group_size, c.max_tokens, c.session_timeout)
                 for i in range(c.groups)]
        sizes = group_sizes(self.client.submit(tasks))
        groups = []
        for group in stream_rl_groups(self.client, sizes):
            groups.append(group)
            if len(groups) == len(sizes):
                self.client.ack(group.seqs)  # the generator acknowledges a group when asked for the next
                break
        rollout_s = time.monotonic() - t0
        outcomes: Counter = Counter()
        rewards = []
        for g in groups:
            outcomes["ok"] += g.sessions
            outcomes.update(g.dropped)
            rewards += [row["reward"] for row in {r["session_id"]: r for r in g.rows}.values()]
        rows = [r for g in groups if g.has_signal for r in g.rows]  # a group whose rewards tie teaches nothing
        record = StepRecord(step=n, version=self.version, sampled_under=self.version, sessions=sum(sizes.values()),
                            outcomes=dict(outcomes), reward_mean=statistics.fmean(rewards) if rewards else None,
                            reward_std=statistics.pstdev(rewards) if rewards else None,
                            groups_with_signal=sum(g.has_signal for g in groups),
                            sampled_tokens=sum(sum(r["loss_mask"]) for g in groups for r in g.rows), rollout_s=rollout_s)
        if rows:
            out = c.out / "weights" / f"v{self.version + 1:04d}"
            record.learner = self.learner.step(rows, out)
            record.sync = self.client.update_policy(self.vllm, out, self.version + 1)
            self.version = record.version = record.sync["policy_version"]
        else:
            record.note = "no group with a reward spread: no update"
        probe = self.probe()
        record.probe_mean = statistics.fmean(probe)
        record.probe_max_change = max(abs(a - b) for a, b in zip(probe, self.last_probe, strict=True))
        self.last_probe = probe
        record.seconds = time.monotonic() - t0
        self.steps.append(record)
        with (c.out / "steps.jsonl").open("a") as f:
            f.write(json.dumps(asdict(record)) + "\n")
        say(describe(record))
        return record

    def run(self) -> list[StepRecord]:
        for _ in range(self.config.steps):
            self.step()
        return self.steps


def describe(r: StepRecord) -> str:
    reward = "no reward" if r.reward_mean is None else f"reward {r.reward_mean:.3f} ± {r.reward_std:.3f}"
    line = (f"step {r.step:>3}  v{r.sampled_under}→v{r.version}  {reward} over {r.sessions} sessions "
            f"({' '.join(f'{k} {v}' for k, v in r.outcomes.items())}; {r.groups_with_signal} groups with signal)  "
            f"{r.sampled_tokens} tokens  rollout {r.rollout_s:.1f}s")
    if r.learner:
        line += (f"  learner loss {r.learner['loss']:+.4f} grad {r.learner['grad_norm']:.2f} "
                 f"|Δlp| vs vLLM {r.learner['mean_abs_gap']:.4f} ({r.learner['train_s']:.1f}s)")
    if r.sync:
        line += f"  sync {r.sync['total_s']:.1f}s"
    line += f"  probe {r.probe_mean:.3f} (max change {r.probe_max_change:.4f})  {r.seconds:.0f}s"
    return line + (f"  [{r.note}]" if r.note else "")


def say(message: str) -> None:
    print(message, flush=True)


def parse(argv: list[str] | None) -> LoopConfig:
    d = LoopConfig(out=Path("."))
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("runs") / time.strftime("closed-loop-%Y%m%d-%H%M%S"),
                   help="run directory (rollout.db, captures.db, steps.jsonl, weights/, report.html, logs)")
    p.add_argument("--steps", type=int, default=d.steps)
    p.add_argument("--groups", type=int, default=d.groups, help="GRPO groups (tasks) per step")
    p.add_argument("--group-size", type=int, default=d.group_size, help="samples per task")
    p.add_argument("--max-tokens", type=int, default=d.max_tokens, help="the toy answer's token limit")
    p.add_argument("--lr", type=float, default=d.lr, help="Adam learning rate")
    p.add_argument("--clip", type=float, default=d.clip, help="ratio clip of the surrogate loss")
    p.add_argument("--max-staleness", type=int, default=d.max_staleness)
    p.add_argument("--running", type=int, default=d.running, help="sessions sampling at once")
    p.add_argument("--model", type=Path, default=d.model, help="the served model's directory (the start policy)")
    p.add_argument("--vllm-url", default=None,
                   help="a vLLM run in dev mode with polar's worker extension (default: start one)")
    p.add_argument("--vllm-python", type=Path, default=d.vllm_python, help="the Python with torch (the learner's)")
    p.add_argument("--no-report", dest="report", action="store_false")
    a = p.parse_args(argv)
    return LoopConfig(out=a.out.resolve(), steps=a.steps, groups=a.groups, group_size=a.group_size,
                      max_tokens=a.max_tokens, lr=a.lr, clip=a.clip, max_staleness=a.max_staleness, running=a.running,
                      model=a.model.resolve(), vllm_url=a.vllm_url, vllm_python=a.vllm_python, report=a.report)


def main(argv: list[str] | None = None) -> int:
    config = parse(argv)
    loop = ClosedLoop(config)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a TERM stops the servers and the learner too
    try:
        loop.start()
        loop.run()
    finally:
        loop.close()
    rewards = [r.reward_mean for r in loop.steps if r.reward_mean is not None]
    if rewards:
        say(f"mean reward: first step {rewards[0]:.3f}, last step {rewards[-1]:.3f}; policy version {loop.version}")
    if config.report:
        from polar.reporting import write_report

        write_report(config.out / "report.html", state=config.out / "rollout.db", captures=config.out / "captures.db")
        say(f"report: {config.out / 'report.html'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
