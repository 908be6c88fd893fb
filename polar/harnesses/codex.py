"""Codex CLI (`codex exec`): the built-in OpenAI provider, i.e. Responses to api.openai.com/v1."""

from __future__ import annotations

from typing import Any

from polar.harnesses.base import HOME, Harness, session_key

# Update checks and analytics off; no plugin/app discovery (remote catalogues the sandbox cannot reach).
CONFIG = """\
model = "{model}"
check_for_update_on_startup = false

[analytics]
enabled = false

[features]
plugins = false
apps = false
"""


class Codex(Harness):
    def command(self, task_prompt: str) -> list[str]:
        return [
            "codex", "exec", "--skip-git-repo-check", "--ephemeral",
            "--dangerously-bypass-approvals-and-sandbox",  # the container is the sandbox
            "-m", self.model, task_prompt,
        ]  # fmt: skip

    def env(self, session: str) -> dict[str, str]:
        return {"CODEX_API_KEY": session_key("sk-", session)}  # read by `codex exec` only

    def files(self, home: str = HOME) -> dict[str, str]:
        return {f"{home}/.codex/config.toml": CONFIG.format(model=self.model)}

    def shell_tool(self, cmd: str) -> dict[str, Any]:
        return {"name": "exec_command", "arguments": {"cmd": cmd}}


CODEX = Codex(
    name="codex",
    package="@openai/codex",
    version="0.169.0",
    provider="openai_responses",
    model="gpt-5-codex",
)
