"""Gemini CLI (`gemini -p`): with GEMINI_API_KEY, generateContent to generativelanguage.googleapis.com."""

from __future__ import annotations

import json
from typing import Any

from polar.harnesses.base import HOME, Harness, session_key

# Usage statistics (Clearcut), telemetry and update checks off; API-key auth chosen up front.
SETTINGS = {
    "privacy": {"usageStatisticsEnabled": False},
    "telemetry": {"enabled": False},
    "general": {"enableAutoUpdate": False, "enableAutoUpdateNotification": False},
    "security": {"auth": {"selectedType": "gemini-api-key"}},
}


class GeminiCli(Harness):
    def command(self, task_prompt: str) -> list[str]:
        return ["gemini", "-p", task_prompt, "-m", self.model, "--approval-mode", "yolo", "--skip-trust", "-o", "text"]

    def env(self, session: str) -> dict[str, str]:
        return {
            "GEMINI_API_KEY": session_key("AIza-", session),
            "GEMINI_CLI_TRUST_WORKSPACE": "true",
            "GEMINI_TELEMETRY_ENABLED": "false",
        }

    def files(self, home: str = HOME) -> dict[str, str]:
        return {f"{home}/.gemini/settings.json": json.dumps(SETTINGS, indent=2)}

    def shell_tool(self, cmd: str) -> dict[str, Any]:
        return {"name": "run_shell_command", "arguments": {"command": cmd, "description": "Run a shell command"}}


GEMINI_CLI = GeminiCli(
    name="gemini_cli",
    package="@google/gemini-cli",
    version="0.61.0",
    provider="gemini",
    model="gemini-2.5-flash",
)
