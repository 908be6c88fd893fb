"""Qwen Code (`qwen`): API-key auth with the OpenAI protocol, i.e. Chat Completions to DashScope's
OpenAI-compatible endpoint (dashscope.aliyuncs.com/compatible-mode/v1, its default with no base URL)."""

from __future__ import annotations

import json
from typing import Any

from polar.harnesses.base import HOME, Harness, session_key


def _settings(model: str) -> dict[str, Any]:
    return {
        "security": {"auth": {"selectedType": "openai"}},  # OAuth cannot run headless
        "model": {"name": model},
        "privacy": {"usageStatisticsEnabled": False},
        "telemetry": {"enabled": False},
        "general": {"enableAutoUpdate": False},
    }


class QwenCode(Harness):
    def command(self, task_prompt: str) -> list[str]:
        return ["qwen", "--model", self.model, "--approval-mode", "yolo", "-o", "text", task_prompt]

    def env(self, session: str) -> dict[str, str]:
        return {
            "OPENAI_API_KEY": session_key("sk-", session),
            "QWEN_CODE_SUPPRESS_YOLO_WARNING": "1",
            "QWEN_CODE_DISABLE_PRECONNECT": "1",  # a HEAD to a DashScope host at start
            "QWEN_USAGE_STATISTICS_ENABLED": "false",
        }

    def files(self, home: str = HOME) -> dict[str, str]:
        return {f"{home}/.qwen/settings.json": json.dumps(_settings(self.model), indent=2)}

    def shell_tool(self, cmd: str) -> dict[str, Any]:
        return {"name": "run_shell_command", "arguments": {"command": cmd, "is_background": False}}

    def read_tool(self, path: str) -> dict[str, Any]:
        # Qwen Code refuses a shell command that edits a file the session has not read.
        return {"name": "read_file", "arguments": {"file_path": path}}


QWEN_CODE = QwenCode(
    name="qwen_code",
    package="@qwen-code/qwen-code",
    version="0.24.4",
    provider="openai_chat",
    model="qwen3-coder-plus",
)
