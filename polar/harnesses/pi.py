"""pi (`pi -p`): its built-in Anthropic provider, i.e. Anthropic Messages to api.anthropic.com.

pi has no permission system at all, so nothing needs skipping.
"""

from __future__ import annotations

from typing import Any

from polar.harnesses.base import Harness, session_key


class Pi(Harness):
    def command(self, task_prompt: str) -> list[str]:
        return ["pi", "-p", "--provider", "anthropic", "--model", self.model, "--no-session", "--offline", task_prompt]

    def env(self, session: str) -> dict[str, str]:
        return {
            "ANTHROPIC_API_KEY": session_key("sk-ant-", session),
            "PI_OFFLINE": "1",  # no start-up network operations
            "PI_SKIP_VERSION_CHECK": "1",
        }

    def shell_tool(self, cmd: str) -> dict[str, Any]:
        return {"name": "bash", "arguments": {"command": cmd}}


PI = Pi(
    name="pi",
    package="@mariozechner/pi-coding-agent",
    version="0.73.1",
    provider="anthropic",
    model="claude-sonnet-4-5",  # a model pi's catalogue knows; polar answers with whatever it serves
)
