"""A generic shell command as a harness: any agent polar has no shortcut for, already in the image.

The task reaches the script as "$1" (never interpolated into it, so no quoting issues) and as
POLAR_INSTRUCTION. In a rollout session the script also gets polar's base URLs and the session's
key (`SessionContext.provider_env`) and may name `{python}` and `{workdir}`; an agent that ignores
base URLs finds its provider by its default host, as the CLIs do in transparent mode.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from polar.harnesses.base import HOME, Harness, SessionContext


@dataclass(frozen=True)
class Shell(Harness):
    script: str = 'echo "$1"'
    variables: dict[str, str] = field(default_factory=dict)
    config_files: dict[str, str] = field(default_factory=dict)  # absolute paths, whoever runs it
    tool: tuple[str, str] | None = None  # (tool name, its command argument), if the agent has a shell tool

    def command(self, task_prompt: str) -> list[str]:
        return ["sh", "-c", self.script, "sh", task_prompt]

    def env(self, session: str) -> dict[str, str]:
        return dict(self.variables)

    def files(self, home: str = HOME) -> dict[str, str]:
        return dict(self.config_files)

    def shell_tool(self, cmd: str) -> dict[str, Any]:
        if self.tool is None:
            raise ValueError(f"harness {self.name!r} declares no shell tool (Shell(tool=(name, argument)))")
        name, argument = self.tool
        return {"name": name, "arguments": {argument: cmd}}

    def launch(self, instruction: str, ctx: SessionContext) -> tuple[list[str], dict[str, str]]:
        env = {**ctx.provider_env(), "POLAR_INSTRUCTION": instruction, **self.variables}
        return ["sh", "-c", ctx.expand(self.script), "sh", instruction], env


# The registry's entry; a real agent is `SHELL.with_options(script=..., variables=...)`.
SHELL = Shell(name="shell", package="", version="", provider="", model="")
