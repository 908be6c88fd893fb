"""What a trainer submits and what it drains: tasks, the sessions they expand into, and results.

A task names everything a session needs by value or by registry name (harness, runtime,
evaluator), so it can be stored as JSON, sent over HTTP or to another machine, and replayed after
a restart. `samples` > 1 makes a GRPO group: independent sessions of the same task.
"""

from __future__ import annotations

import json
import secrets
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from polar.trajectories.model import Trajectory

Stage = Literal["queued", "init", "ready", "running", "postrun", "done"]
# ok: harness ended by itself; timeout: deadline hit (partial trajectory kept); error: a runtime,
# harness install or evaluator crash (see `error`); stale: refused, policy too far behind;
# cancelled: the trainer cancelled the task before the session finished. The watchdog's cuts (the
# trajectory so far kept, `partial` and `cut` set): looping: the same tool call or text over and over;
# stalled: no model call for too long; budget: the session's sampled tokens reached its budget.
Outcome = Literal["ok", "timeout", "error", "stale", "cancelled", "looping", "stalled", "budget"]
CUT_OUTCOMES = ("looping", "stalled", "budget")


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Named(_Model):
    """A registry entry and its options, e.g. {"name": "swe", "options": {...}}."""

    name: str
    options: dict[str, Any] = Field(default_factory=dict)


class WatchdogOptions(_Model):
    """The long tail cut (polar.rollout.watchdog): a session that trips one of these ends early. None: not watched."""

    repeated_tool_calls: int | None = Field(default=None, ge=2)  # the same tool call(s) N answers in a row
    # The same text K times: an answer whose tail repeats one span K times, or K answers in a row alike.
    repeated_text: int | None = Field(default=None, ge=2)
    min_span_chars: int = Field(default=32, ge=1)  # shorter repeated spans are not looping (lists, tables)
    stall_seconds: float | None = Field(default=None, gt=0)  # no model call started or ended for this long
    token_budget: int | None = Field(default=None, ge=1)  # tokens the session's calls may sample in all
    poll_seconds: float = Field(default=0.5, gt=0)  # how often the capture store is read

    @property
    def active(self) -> bool:
        return any(v is not None for v in (self.repeated_tool_calls, self.repeated_text, self.stall_seconds,
                                           self.token_budget))

    def over(self, base: WatchdogOptions | None) -> WatchdogOptions:
        """These options over `base` (the run's): what this one sets wins, the rest comes from `base`."""
        if base is None:
            return self
        return base.model_copy(update={k: getattr(self, k) for k in self.model_fields_set})


class TaskSpec(_Model):
    # Session ids derive from it and travel in capture rows, URLs and sandbox names: keep it plain.
    id: str = Field(default_factory=lambda: "task-" + secrets.token_hex(4),
                    pattern=r"^[A-Za-z0-9_:-][A-Za-z0-9._:-]{0,99}$")
    instruction: str
    repo: str | None = None  # host directory copied into the session's workdir
    # The container image; None: Docker builds one for the harness (its CLI, git, python3, pytest).
    image: str | None = None  # ignored by the local runtime
    # Where the repository is (and the harness works): a SWE-bench instance image has it at /testbed.
    workdir: str = Field(default="/work", pattern=r"^/[A-Za-z0-9._/-]*$")
    harness: Named = Field(default_factory=lambda: Named(name="python-agent"))
    runtime: str = "local"
    evaluator: Named = Field(default_factory=lambda: Named(name="completed"))
    samples: int = Field(default=1, ge=1, le=1024)
    timeout: float = Field(default=600.0, gt=0)  # seconds the harness may run
    model: str = "polar-policy"  # the model name harnesses ask for
    policy_version: int | None = None  # the trainer's version at submission (default: the service's)
    watchdog: WatchdogOptions | None = None  # over the run's watchdog options (NodeConfig.watchdog)
    metadata: dict[str, Any] = Field(default_factory=dict)


class SessionSpec(_Model):
    """One sample of a task: the unit the pools schedule."""

    session_id: str
    task: TaskSpec
    sample: int
    attempt: int = 0  # restarts after a server crash: each attempt is its own capture session

    @property
    def capture_id(self) -> str:
        """The session id this attempt's calls are captured under (a retry must not inherit a dead attempt's)."""
        return self.session_id if self.attempt == 0 else f"{self.session_id}.r{self.attempt}"

    @classmethod
    def expand(cls, task: TaskSpec) -> list[SessionSpec]:
        return [cls(session_id=f"{task.id}.{i}.{secrets.token_hex(3)}", task=task, sample=i)
                for i in range(task.samples)]


class SessionResult(_Model):
    session_id: str
    task_id: str
    sample: int
    outcome: Outcome
    reward: float | None = None
    error: str | None = None  # the cause, for outcome "error" (which stage, what failed)
    partial: bool = False  # the trajectory stopped early (deadline, watchdog) but is kept
    cut: dict[str, Any] | None = None  # the watchdog's cut: {"reason": outcome, "detail": what it saw, "at": seconds}
    harness_exit: int | None = None
    harness_output: str = ""  # the tail of the harness's stdout and stderr, for diagnosis
    policy_version: int | None = None  # the trainer's version when the session started running
    trajectories: list[Trajectory] = Field(default_factory=list)
    evaluation: dict[str, Any] = Field(default_factory=dict)  # the evaluator's details
    timings: dict[str, float] = Field(default_factory=dict)  # seconds per stage
    metadata: dict[str, Any] = Field(default_factory=dict)
    node: str | None = None


def harness_name(spec_json: str | None) -> str | None:
    """The harness a stored SessionSpec (JSON) ran, read leniently: a spec another polar version
    wrote still names it, and one that does not gives None."""
    try:
        harness = json.loads(spec_json or "null")["task"]["harness"]
    except (ValueError, KeyError, TypeError):
        return None
    return harness.get("name") if isinstance(harness, dict) else None


# Evaluator options that name host files: relative paths in a tasks file are relative to that file.
# (A harness's `script` is a shell command, not a file.)
_PATH_OPTIONS = ("hidden", "script", "tests")


def load_tasks(path: str | Path) -> list[TaskSpec]:
    """Tasks from a JSONL file (one task per line; blank lines and `#` comments skipped)."""
    path = Path(path)
    base = path.resolve().parent
    tasks = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            task = TaskSpec.model_validate(json.loads(line))
        except ValueError as exc:
            raise ValueError(f"{path}:{n}: {exc}") from None
        if task.repo:
            task.repo = str(base / task.repo)
        for key in _PATH_OPTIONS:
            if isinstance(task.evaluator.options.get(key), str):
                task.evaluator.options[key] = str(base / task.evaluator.options[key])
        tasks.append(task)
    return tasks
