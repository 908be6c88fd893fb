"""How a session's harness is started: the `Harness` interface, its registry, and two generic ones.

A harness says which files it needs in the sandbox and which command (with which environment)
runs it for one task. It reaches polar through the provider base URLs and the per-session API
key in `SessionContext`; a harness that ignores base URLs (a real CLI in a container) reaches polar
through the runtime's interception instead, and the same key still names its session.

`shell` runs any command; `python-agent` is a small tool-calling agent on the `openai` SDK
(`agent_script.py`) for tests and demos. The real CLI harnesses register themselves here too.
"""

from __future__ import annotations

import os
import shlex
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from polar.rollout.tasks import Named, TaskSpec

AGENT_SCRIPT = Path(__file__).with_name("agent_script.py")
SUPPORT_DIR = "/polar"  # sandbox directory for polar's own files: outside the workdir, so out of the diff


@dataclass(frozen=True)
class SessionContext:
    session_id: str
    api_key: str  # registered for this session in the gateway's registry
    base_url: str  # polar's root URL as seen from the sandbox (reverse mode)
    workdir: str  # sandbox path of the repository
    model: str
    python: str  # the Python interpreter inside the sandbox

    def sandbox_relative(self, sandbox_path: str) -> str:
        """A sandbox path as commands should name it: relative to the workdir, which every runtime honours."""
        return os.path.relpath(sandbox_path, self.workdir)

    def provider_env(self) -> dict[str, str]:
        """Base URLs and keys for every provider SDK, all pointing at polar with this session's key."""
        base = self.base_url.rstrip("/")
        return {
            "OPENAI_BASE_URL": f"{base}/v1",
            "OPENAI_API_KEY": self.api_key,
            "ANTHROPIC_BASE_URL": base,
            "ANTHROPIC_API_KEY": self.api_key,
            "GOOGLE_GEMINI_BASE_URL": base,
            "GEMINI_API_KEY": self.api_key,
            "POLAR_MODEL": self.model,
            "POLAR_SESSION": self.session_id,
        }

    def expand(self, text: str) -> str:
        """`{python}` and `{workdir}` placeholders in task-supplied commands."""
        return text.replace("{python}", shlex.quote(self.python)).replace("{workdir}", self.workdir)


class Harness(ABC):
    name: ClassVar[str]

    def __init__(self, **options: Any):
        self.options = options

    @abstractmethod
    def command(self, task: TaskSpec, ctx: SessionContext) -> tuple[list[str], dict[str, str]]:
        """The argv (run in the workdir) and the extra environment for one session."""

    def files_to_install(self, task: TaskSpec, ctx: SessionContext) -> dict[str, Path]:
        """Host files to copy into the sandbox before the session runs: {sandbox path: host path}."""
        return {}


class ShellHarness(Harness):
    """Any command: options `command` (a shell string; `{python}`, `{workdir}` expanded)."""

    name = "shell"

    def command(self, task: TaskSpec, ctx: SessionContext) -> tuple[list[str], dict[str, str]]:
        command = self.options.get("command")
        if not isinstance(command, str) or not command:
            raise ValueError("the shell harness needs options.command (a shell command string)")
        return ["sh", "-c", ctx.expand(command)], {**ctx.provider_env(), "POLAR_INSTRUCTION": task.instruction}


class PythonAgentHarness(Harness):
    """A minimal tool-calling agent (run, read_file, write_file, edit_file) on the OpenAI Chat API."""

    name = "python-agent"
    script_path = f"{SUPPORT_DIR}/agent.py"

    def command(self, task: TaskSpec, ctx: SessionContext) -> tuple[list[str], dict[str, str]]:
        env = {**ctx.provider_env(), "POLAR_INSTRUCTION": task.instruction,
               "POLAR_MAX_STEPS": str(self.options.get("max_steps", 20))}
        return [ctx.python, ctx.sandbox_relative(self.script_path)], env

    def files_to_install(self, task: TaskSpec, ctx: SessionContext) -> dict[str, Path]:
        return {self.script_path: AGENT_SCRIPT}


HARNESSES: dict[str, type[Harness]] = {}


def register_harness(cls: type[Harness]) -> type[Harness]:
    HARNESSES[cls.name] = cls
    return cls


for _cls in (ShellHarness, PythonAgentHarness):
    register_harness(_cls)


def make_harness(spec: Named) -> Harness:
    try:
        cls = HARNESSES[spec.name]
    except KeyError:
        raise ValueError(f"unknown harness {spec.name!r} (known: {', '.join(sorted(HARNESSES))})") from None
    return cls(**spec.options)
