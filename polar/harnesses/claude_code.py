"""Claude Code (`claude -p`): Anthropic Messages to api.anthropic.com, a native binary in the npm package."""

from __future__ import annotations

from typing import Any

from polar.harnesses.base import Harness, session_key


class ClaudeCode(Harness):
    def command(self, task_prompt: str) -> list[str]:
        return ["claude", "-p", task_prompt, "--model", self.model, "--dangerously-skip-permissions", "--output-format", "text"]

    def env(self, session: str) -> dict[str, str]:
        return {
            "ANTHROPIC_API_KEY": session_key("sk-ant-", session),
            "IS_SANDBOX": "1",  # sandboxes run as root; without it the bypass flag is refused
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",  # telemetry, error reports, auto-update
            "DISABLE_AUTOUPDATER": "1",
        }

    def shell_tool(self, cmd: str) -> dict[str, Any]:
        return {"name": "Bash", "arguments": {"command": cmd, "description": "Run a shell command"}}


CLAUDE_CODE = ClaudeCode(
    name="claude_code",
    package="@anthropic-ai/claude-code",
    version="2.1.330",
    provider="anthropic",
    model="claude-sonnet-4-5",
)
