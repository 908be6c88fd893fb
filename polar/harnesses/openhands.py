"""OpenHands (PyPI `openhands-sdk` + `openhands-tools`), driven headless by a short script with its SDK
(`openhands_script.py`): the SDK's default agent in CLI mode (terminal, file editor, task tracker; its condenser),
the task as the one message, run until the conversation finishes or `max_steps` are spent.

It needs Python >= 3.12, newer than the images' 3.11: the host's CPython 3.12 is laid into its image
(pip_harness.py, `runtimes/docker/pip-python`), with tmux, which its terminal tool drives. It reaches the model
through LiteLLM with polar's base URL: `api` chat (Chat Completions, not streamed, `reasoning_effort` set),
responses (`/v1/responses`) or messages (`anthropic/` on polar's root: `/v1/messages`). LiteLLM's price map is
read locally (no fetch); no telemetry is configured, and the sandbox has no other egress. Its state stays in
memory and its home, outside the workdir.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from polar.harnesses.base import SUPPORT_DIR, SessionContext, session_key
from polar.harnesses.pip_harness import VENV, PipHarness

DRIVER = Path(__file__).with_name("openhands_script.py")
APIS = {"chat": "openai_chat", "responses": "openai_responses", "messages": "anthropic"}  # api -> polar provider


@dataclass(frozen=True)
class OpenHands(PipHarness):
    api: str = "chat"
    max_steps: int = 30
    script: str = f"{SUPPORT_DIR}/run_openhands.py"  # not openhands.py: its directory comes first on sys.path

    def command(self, task_prompt: str) -> list[str]:
        return [f"{VENV}/bin/python", self.script, task_prompt]

    def env(self, session: str) -> dict[str, str]:
        if self.api not in APIS:
            raise ValueError(f"openhands: api {self.api!r} is not one of {', '.join(APIS)}")
        key = session_key("sk-", session)
        return {"POLAR_OPENHANDS_API": self.api, "POLAR_MAX_STEPS": str(self.max_steps), "POLAR_MODEL": self.model,
                "OPENHANDS_SUPPRESS_BANNER": "1", "LITELLM_LOCAL_MODEL_COST_MAP": "True",
                "OPENAI_API_KEY": key, "ANTHROPIC_API_KEY": key}

    def launch(self, instruction: str, ctx: SessionContext) -> tuple[list[str], dict[str, str]]:
        env = {**ctx.provider_env(), **self.env(ctx.session_id), "OPENAI_API_KEY": ctx.api_key,
               "ANTHROPIC_API_KEY": ctx.api_key, "POLAR_MODEL": ctx.model}
        return [f"{VENV}/bin/python", ctx.sandbox_relative(self.script), instruction], env

    def host_files(self, ctx: SessionContext) -> dict[str, Path]:
        return {self.script: DRIVER}

    def shell_tool(self, cmd: str) -> dict[str, Any]:
        return {"name": "terminal", "arguments": {"command": cmd}}

    def with_options(self, **options: Any) -> OpenHands:
        """`api` also sets the provider its calls are captured under."""
        if "api" in options and "provider" not in options:
            options["provider"] = APIS.get(options["api"], self.provider)
        return super().with_options(**options)  # type: ignore[return-value]


OPENHANDS = OpenHands(name="openhands", package="openhands-sdk openhands-tools", version="1.58.2", provider="openai_chat",
                      model="polar-policy", python="3.12", debs=("tmux",))
