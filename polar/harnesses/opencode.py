"""opencode (`opencode run`): its built-in Anthropic provider, i.e. Anthropic Messages to api.anthropic.com."""

from __future__ import annotations

import json
from typing import Any

from polar.harnesses.base import HOME, Harness, session_key


def _config(model: str) -> dict[str, Any]:
    return {
        "model": model,
        "small_model": model,  # titles and summaries too: one model name in the captures
        "permission": "allow",  # headless runs otherwise reject what would prompt
        "autoupdate": False,
        "share": "disabled",
    }


class OpenCode(Harness):
    def command(self, task_prompt: str) -> list[str]:
        return ["opencode", "run", "--model", self.model, "--auto", task_prompt]

    def env(self, session: str) -> dict[str, str]:
        return {
            "ANTHROPIC_API_KEY": session_key("sk-ant-", session),
            "OPENCODE_DISABLE_MODELS_FETCH": "1",  # use the catalogue bundled in the binary
            "OPENCODE_DISABLE_AUTOUPDATE": "1",
            "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
        }

    def files(self, home: str = HOME) -> dict[str, str]:
        return {f"{home}/.config/opencode/opencode.json": json.dumps(_config(self.model), indent=2)}

    def shell_tool(self, cmd: str) -> dict[str, Any]:
        return {"name": "bash", "arguments": {"command": cmd, "description": "Run a shell command"}}


OPENCODE = OpenCode(
    name="opencode",
    package="opencode-ai",
    version="1.18.33",
    provider="anthropic",
    model="anthropic/claude-sonnet-4-5",
)
