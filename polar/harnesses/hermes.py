"""Hermes Agent (`hermes -z`), Nous Research's agent, one-shot: the final answer on stdout, commands auto-approved.

It ignores OPENAI_BASE_URL: its `custom` provider takes the endpoint from CUSTOM_BASE_URL and the key from
OPENAI_API_KEY. No context length is configured, so it asks the endpoint for one before its first call
(polar's /v1/models carries `max_model_len`, as vLLM's does; Ollama's /api/show is answered too).
Calls: OpenAI Chat, streamed. `--ignore-rules` keeps AGENTS.md and memory files out of the prompt; its state
lives in HERMES_HOME, outside the workdir (out of the diff). `-z` checks for no update.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from polar.harnesses.base import SessionContext, session_key
from polar.harnesses.pip_harness import PipHarness


@dataclass(frozen=True)
class Hermes(PipHarness):
    home: str = "/tmp/hermes-home"

    def command(self, task_prompt: str) -> list[str]:
        return [self.bin("hermes"), "-z", task_prompt, "--provider", "custom", "-m", self.model, "--ignore-rules"]

    def env(self, session: str) -> dict[str, str]:
        return {"HERMES_HOME": self.home, "OPENAI_API_KEY": session_key("sk-", session)}

    def launch(self, instruction: str, ctx: SessionContext) -> tuple[list[str], dict[str, str]]:
        env = {**ctx.provider_env(), **self.env(ctx.session_id), "OPENAI_API_KEY": ctx.api_key,
               "CUSTOM_BASE_URL": f"{ctx.base_url.rstrip('/')}/v1"}
        return self.command(instruction), env

    def shell_tool(self, cmd: str) -> dict[str, Any]:
        return {"name": "terminal", "arguments": {"command": cmd}}


HERMES = Hermes(name="hermes", package="hermes-agent", version="0.19.0", provider="openai_chat", model="polar-policy")
