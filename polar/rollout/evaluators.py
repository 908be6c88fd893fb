"""Evaluators turn a finished session into a reward (and optionally one reward per turn).

Built-ins: `completed` (the harness ended by itself), `test_output` (run a command in the
session's sandbox, score its output), `swe` (apply the session's diff to a clean copy of the
repository with the hidden tests, run FAIL_TO_PASS and PASS_TO_PASS), `swebench` (a SWE-bench
instance graded by the `swebench` package's own code: polar.rollout.swebench_eval), `script_reward` (a script
writes a reward file). Anything else is `module:attribute`: an `Evaluator` subclass, or a function
taking an `EvalContext` and returning a float, a dict with `reward`, or an `Evaluation`.

`prepare` runs in INIT (e.g. the SWE evaluator starts its clean sandbox there), so POSTRUN only
pays for the tests themselves.
"""

from __future__ import annotations

import importlib
import json
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from polar.harnesses import SUPPORT_DIR, SessionContext
from polar.rollout.node import HarnessRun
from polar.rollout.tasks import Named, TaskSpec
from polar.sandboxes.base import Runtime, Sandbox, SandboxSpec
from polar.trajectories.model import Trajectory


@dataclass
class EvalContext:
    task: TaskSpec
    session: SessionContext
    sandbox: Sandbox  # the session's own sandbox, as the harness left it
    runtime: Runtime
    run: HarnessRun
    diff: str | None  # the session's changes to the repository (git diff, binary-safe); None: no git in the image
    trajectories: list[Trajectory]
    prepared: Any = None  # what `prepare` returned


@dataclass
class Evaluation:
    reward: float
    step_rewards: list[float | None] | None = None  # one per turn of the session's main trajectory
    details: dict[str, Any] = field(default_factory=dict)


class Evaluator:
    name: ClassVar[str] = ""

    def __init__(self, **options: Any):
        self.options = options

    def prepare(self, task: TaskSpec, runtime: Runtime, session: SessionContext) -> Any:
        """Prewarm during INIT; the result comes back as `EvalContext.prepared`."""
        return None

    def evaluate(self, ctx: EvalContext) -> Evaluation:
        raise NotImplementedError

    def cleanup(self, prepared: Any) -> None:
        """Release what `prepare` made (always called, even when evaluation failed)."""


class Completed(Evaluator):
    name = "completed"

    def evaluate(self, ctx: EvalContext) -> Evaluation:
        ok = ctx.run.exit_code == 0 and not ctx.run.timed_out and not ctx.run.error
        return Evaluation(1.0 if ok else 0.0, details={"exit_code": ctx.run.exit_code, "timed_out": ctx.run.timed_out})


# `-rA` lists every test's outcome; other pytest plugins in the image stay out of the reward.
DEFAULT_TEST_COMMAND = "PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 {python} -m pytest -rA -q -p no:cacheprovider"
_COUNT = re.compile(r"(\d+) (passed|failed|errors?)\b")
_OUTCOME_LINE = re.compile(r"^(PASSED|FAILED|ERROR|XFAIL|XPASS|SKIPPED) (\S+)", re.MULTILINE)


def pytest_counts(output: str) -> dict[str, int]:
    """passed / failed / error counts from pytest's last summary line."""
    counts = {"passed": 0, "failed": 0, "error": 0}
    summary = [line for line in output.splitlines() if _COUNT.search(line)]
    for n, kind in _COUNT.findall(summary[-1] if summary else ""):
        counts["error" if kind.startswith("error") else kind] += int(n)
    return counts


def pytest_outcomes(output: str) -> dict[str, str]:
    """Per-test outcomes from pytest's `-rA` short summary (`PASSED tests/x.py::test_y`)."""
    return {test: status for status, test in _OUTCOME_LINE.findall(output)}


class TestOutput(Evaluator):
    """options: command (run in the workdir), parse: exit | pytest | json, timeout."""

    name = "test_output"
    __test__ = False  # not a pytest class, despite its name

    def evaluate(self, ctx: EvalContext) -> Evaluation:
        command = self.options.get("command")
        if not isinstance(command, str):
            raise ValueError("test_output needs options.command")
        done = ctx.sandbox.exec(ctx.session.expand(command), timeout=float(self.options.get("timeout", 300)))
        parse = self.options.get("parse", "exit")
        details: dict[str, Any] = {"exit_code": done.exit_code, "timed_out": done.timed_out}
        if parse == "exit":
            return Evaluation(1.0 if done.ok else 0.0, details=details)
        if parse == "pytest":
            counts = pytest_counts(done.stdout + done.stderr)
            total = sum(counts.values())
            return Evaluation(counts["passed"] / total if total else 0.0, details={**details, **counts})
        if parse == "json":
            lines = [line for line in done.stdout.splitlines() if line.strip()]
            data = json.loads(lines[-1]) if lines else {}
            return Evaluation(float(data["reward"]), data.get("step_rewards"), details={**details, **data})
        raise ValueError(f"test_output: unknown parse {parse!r} (exit, pytest or json)")


class SWE(Evaluator):
    """SWE-bench style. options: hidden (host dir overlaid on the clean copy after the diff: the
    hidden tests), fail_to_pass, pass_to_pass (test ids), test_command (`{python}` expanded; the
    ids are appended), timeout. Reward 1 when every listed test passes, else 0."""

    name = "swe"

    def prepare(self, task: TaskSpec, runtime: Runtime, session: SessionContext) -> Any:
        sandbox = runtime.start(SandboxSpec(image=task.image or "", session=f"{session.session_id}-eval",
                                            workdir=session.workdir))
        try:
            if task.repo:
                sandbox.copy_in(task.repo, session.workdir)
        except Exception:
            sandbox.stop()
            raise
        return sandbox

    def evaluate(self, ctx: EvalContext) -> Evaluation:
        clean: Sandbox = ctx.prepared
        if ctx.diff is None:
            raise RuntimeError("the session's image has no git, so its changes cannot be taken as a diff")
        if ctx.diff.strip():
            with tempfile.TemporaryDirectory() as tmp:
                patch = Path(tmp) / "patch.diff"
                patch.write_text(ctx.diff)
                clean.copy_in(patch, f"{SUPPORT_DIR}/patch.diff")
            patch_path = ctx.session.sandbox_relative(f"{SUPPORT_DIR}/patch.diff")
            applied = clean.exec(["git", "apply", "--whitespace=nowarn", patch_path])
            if not applied.ok:
                return Evaluation(0.0, details={"patch_applies": False, "git_apply": applied.stderr[-2000:]})
        if self.options.get("hidden"):
            clean.copy_in(self.options["hidden"], ctx.session.workdir)  # last: the session cannot alter the tests
        f2p, p2p = list(self.options.get("fail_to_pass", [])), list(self.options.get("pass_to_pass", []))
        command = self.options.get("test_command", DEFAULT_TEST_COMMAND)
        done = clean.exec(f"{ctx.session.expand(command)} {' '.join(f2p + p2p)}",
                          timeout=float(self.options.get("timeout", 300)))
        outcomes = pytest_outcomes(done.stdout)
        passed = {t: outcomes.get(t) == "PASSED" for t in f2p + p2p}
        details = {"patch_applies": True, "fail_to_pass": {t: passed[t] for t in f2p},
                   "pass_to_pass": {t: passed[t] for t in p2p}, "timed_out": done.timed_out}
        return Evaluation(1.0 if passed and all(passed.values()) else 0.0, details=details)

    def cleanup(self, prepared: Any) -> None:
        if prepared is not None:
            prepared.stop()


class ScriptReward(Evaluator):
    """options: script (host file), interpreter (default `sh`; `{python}` expanded), timeout.
    The script runs in the workdir with POLAR_REWARD_FILE set; it writes a number there, or JSON
    `{"reward": x, "step_rewards": [...]}`."""

    name = "script_reward"
    reward_path = f"{SUPPORT_DIR}/reward"
    script_path = f"{SUPPORT_DIR}/reward_script"

    def evaluate(self, ctx: EvalContext) -> Evaluation:
        if not self.options.get("script"):
            raise ValueError("script_reward needs options.script")
        ctx.sandbox.copy_in(self.options["script"], self.script_path)
        interpreter = ctx.session.expand(self.options.get("interpreter", "sh"))
        done = ctx.sandbox.exec(f"{interpreter} {ctx.session.sandbox_relative(self.script_path)}",
                                env={"POLAR_REWARD_FILE": ctx.session.sandbox_relative(self.reward_path)},
                                timeout=float(self.options.get("timeout", 300)))
        with tempfile.TemporaryDirectory() as tmp:
            try:
                ctx.sandbox.copy_out(self.reward_path, Path(tmp) / "reward")
            except FileNotFoundError:
                raise RuntimeError(f"the reward script wrote no reward file (exit {done.exit_code}): "
                                   f"{done.stderr[-500:]}") from None
            text = (Path(tmp) / "reward").read_text().strip()
        data = json.loads(text)
        if isinstance(data, dict):
            return Evaluation(float(data["reward"]), data.get("step_rewards"), details={"exit_code": done.exit_code})
        return Evaluation(float(data), details={"exit_code": done.exit_code})


class _FunctionEvaluator(Evaluator):
    def __init__(self, fn, **options: Any):
        super().__init__(**options)
        self.fn = fn

    def evaluate(self, ctx: EvalContext) -> Evaluation:
        out = self.fn(ctx, **self.options)
        if isinstance(out, Evaluation):
            return out
        if isinstance(out, dict):
            return Evaluation(float(out["reward"]), out.get("step_rewards"), out.get("details", {}))
        return Evaluation(float(out))


EVALUATORS: dict[str, type[Evaluator]] = {cls.name: cls for cls in (Completed, TestOutput, SWE, ScriptReward)}
# Built-ins in their own modules, imported when first named (they import this one).
_BUILTIN_ELSEWHERE = {"swebench": "polar.rollout.swebench_eval:SWEBench",
                      "harbor": "polar.rollout.harbor_tasks:HarborVerifier"}


def make_evaluator(spec: Named) -> Evaluator:
    if spec.name in EVALUATORS:
        return EVALUATORS[spec.name](**spec.options)
    name = _BUILTIN_ELSEWHERE.get(spec.name, spec.name)
    if ":" not in name:
        raise ValueError(f"unknown evaluator {spec.name!r}: use one of {', '.join([*EVALUATORS, *_BUILTIN_ELSEWHERE])} "
                         "or module:attribute")
    module, _, attr = name.partition(":")
    target = getattr(importlib.import_module(module), attr)
    if isinstance(target, type) and issubclass(target, Evaluator):
        return target(**spec.options)
    if callable(target):
        return _FunctionEvaluator(target, **spec.options)
    raise ValueError(f"evaluator {spec.name!r} is neither an Evaluator class nor a function")
