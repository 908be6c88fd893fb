"""mini-swe-agent (`mini`), the minimal agent much SWE RL work uses: one `bash` tool, or text actions.

Run headless: `--yolo` (no confirmation), `--exit-immediately` (no prompt when it submits), no cost
limit; it ends when the agent runs `echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT`. It reaches the model
through LiteLLM as `openai/<model>` on polar's base URL (OPENAI_BASE_URL), Chat Completions, not streamed.
LiteLLM's price map is read locally (no fetch) and unknown prices are not an error.

`text_based=True` is its text-based mode (`mini_textbased.yaml`): no tools; each answer holds one fenced
block tagged `mswea_bash_command`, and observations come back as user messages.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from polar.harnesses.base import SessionContext, session_key
from polar.harnesses.pip_harness import PipHarness

SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
TEXT_ACTION = "mswea_bash_command"  # the fence tag of an action in text-based mode


@dataclass(frozen=True)
class MiniSweAgent(PipHarness):
    text_based: bool = False
    step_limit: int = 0  # its own limit on model calls (0: none; it then ends only by submitting)
    trajectory: str = "/tmp/mini.traj.json"  # its own trajectory file, outside the workdir (out of the diff)

    def command(self, task_prompt: str) -> list[str]:
        mode = ["-c", "mini_textbased.yaml", "--model-class", "litellm_textbased"] if self.text_based else ["-c", "mini.yaml"]
        if self.step_limit:
            mode += ["-c", f"agent.step_limit={self.step_limit}"]
        return [self.bin("mini"), *mode, "-m", f"openai/{self.model}", "-t", task_prompt, "--yolo",
                "--exit-immediately", "-l", "0", "-o", self.trajectory]

    def env(self, session: str) -> dict[str, str]:
        return {"MSWEA_CONFIGURED": "true", "MSWEA_COST_TRACKING": "ignore_errors", "LITELLM_LOCAL_MODEL_COST_MAP": "True",
                "OPENAI_API_KEY": session_key("sk-", session)}

    def launch(self, instruction: str, ctx: SessionContext) -> tuple[list[str], dict[str, str]]:
        return self.command(instruction), {**ctx.provider_env(), **self.env(ctx.session_id), "OPENAI_API_KEY": ctx.api_key}

    def shell_tool(self, cmd: str) -> dict[str, Any]:
        return {"name": "bash", "arguments": {"command": cmd}}

    def end_tool(self) -> dict[str, Any] | None:
        return None if self.text_based else self.shell_tool(SUBMIT)

    def text_action(self, cmd: str, thought: str = "THOUGHT: the next step.") -> str:
        """An answer in text-based mode that runs `cmd`."""
        return f"{thought}\n\n```{TEXT_ACTION}\n{cmd}\n```"


MINI_SWE_AGENT = MiniSweAgent(name="mini_swe_agent", package="mini-swe-agent", version="2.4.6", provider="openai_chat",
                              model="polar-policy")
