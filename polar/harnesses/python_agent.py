"""`python-agent`: a minimal tool-calling agent on the OpenAI Chat API (`agent_script.py`).

For tests and demos without a container: it runs wherever there is a Python with the `openai`
package, takes polar's base URL from the environment, and has a `run` tool for shell commands
(besides read_file, write_file and edit_file).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from polar.harnesses.base import SUPPORT_DIR, Harness, SessionContext

AGENT_SCRIPT = Path(__file__).with_name("agent_script.py")


@dataclass(frozen=True)
class PythonAgent(Harness):
    max_steps: int = 20
    script_path: str = f"{SUPPORT_DIR}/agent.py"

    def command(self, task_prompt: str) -> list[str]:
        return ["python3", self.script_path]

    def env(self, session: str) -> dict[str, str]:
        return {"POLAR_MAX_STEPS": str(self.max_steps)}

    def shell_tool(self, cmd: str) -> dict[str, Any]:
        return {"name": "run", "arguments": {"command": cmd}}

    def launch(self, instruction: str, ctx: SessionContext) -> tuple[list[str], dict[str, str]]:
        env = {**ctx.provider_env(), **self.env(ctx.session_id), "POLAR_INSTRUCTION": instruction}
        return [ctx.python, ctx.sandbox_relative(self.script_path)], env

    def host_files(self, ctx: SessionContext) -> dict[str, Path]:
        return {self.script_path: AGENT_SCRIPT}


PYTHON_AGENT = PythonAgent(name="python-agent", package="", version="", provider="openai_chat", model="polar-policy")
