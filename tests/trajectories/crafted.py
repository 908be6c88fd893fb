"""Crafted capture stores for the trajectory tests, written through the store's own API, and a
real multi-turn session driven through polar with the official openai SDK."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from polar.capture.store import CaptureStore


def conversation(task: str, rounds: int, tail: str = "tool") -> list[dict]:
    """Canonical messages: a task, `rounds` assistant turns each answered by `tail` ("tool" or "user")."""
    messages = [{"role": "system", "content": [{"text": "You are a coding agent."}]},
                {"role": "user", "content": [{"text": task}]}]
    for i in range(rounds):
        messages.append({"role": "assistant", "content": [{"text": f"step {i}"}]})
        messages.append({"role": tail, "content": [{"text": f"result {i}"}]})
    return messages


class Recorder:
    """Writes calls into a real CaptureStore the way the gateway does (begin → finish)."""

    def __init__(self, path: Path):
        self.path = path
        self.store = CaptureStore(path)
        self._closed = False

    def close(self) -> None:
        """Stop the store's writer (once), e.g. before another process opens the database."""
        if not self._closed:
            self._closed = True
            self.store.close()

    def call(
        self,
        session: str,
        prompt: list[int],
        completion: list[int],
        messages: list[dict] | None = None,
        finish: str = "stop",
        mode: str = "token-faithful",
        logprobs: list[float] | None = None,
        metadata: dict | None = None,
        policy: str | None = None,
        continues: str | None = None,
    ) -> int:
        row_id = self._begin(session)
        fields = self.store.tokens_fields(
            session, row_id, prompt, completion,
            [-0.25 - i / 100 for i in range(len(completion))] if logprobs is None else logprobs,
        )
        fields.update(status="ok", finish_reason=finish, prompt_mode=mode, policy_version=policy,
                      model="test-model", canonical=self._canonical(messages, metadata, continues))
        asyncio.run(self.store.finish(row_id, fields))
        return row_id

    def fail(self, session: str, messages: list[dict] | None = None, status: str = "error") -> int:
        row_id = self._begin(session)
        fields = {"status": status, "error_kind": "upstream", "error": "scripted failure",
                  "canonical": self._canonical(messages, None)}
        asyncio.run(self.store.finish(row_id, fields))
        return row_id

    def count_tokens(self, session: str) -> int:
        """An ok call that samples nothing (a token count): no token columns."""
        row_id = self._begin(session)
        asyncio.run(self.store.finish(row_id, {"status": "ok", "http_status": 200}))
        return row_id

    def rows(self) -> list[dict]:
        return list(self.store.calls())

    def _begin(self, session: str) -> int:
        row_id = self.store.allocate_id()
        self.store.begin({"id": row_id, "call_id": f"c{row_id:04d}", "session_id": session,
                          "provider": "test", "status": "pending"})
        return row_id

    @staticmethod
    def _canonical(messages: list[dict] | None, metadata: dict | None, continues: str | None = None) -> str | None:
        if messages is None:
            return None
        extra = {**({"metadata": metadata} if metadata else {}), **({"continues": continues} if continues else {})}
        return json.dumps({"model": "test-model", "messages": messages, **extra})


# -- a real session: the official openai SDK -> polar -> the scripted vLLM double ------------------

READ = {"type": "function", "function": {"name": "read_file", "description": "Read a file",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}}
STEPS = [
    {"reasoning": "Look at the entry point first.", "content": "", "tool_calls": [{"name": "read_file", "arguments": {"path": "src/main.py"}}]},
    {"reasoning": "Both helpers matter.", "content": "Reading both.", "tool_calls": [
        {"name": "read_file", "arguments": {"path": "a.py"}}, {"name": "read_file", "arguments": {"path": "b/ü.py"}}]},
    {"reasoning": "Ask before editing.", "content": "Shall I patch `a.py`?"},
    {"reasoning": "The user agreed.", "content": "", "tool_calls": [{"name": "read_file", "arguments": {"path": "a.py"}}]},
    {"reasoning": "Done.", "content": "Fixed — ünïcode ✓"},
]


def run_openai_session(stack, session: str, keep_reasoning: bool = True) -> list[dict]:
    """Drive a multi-turn tool session the way a harness does; returns its capture rows."""
    import openai

    stack.script(steps=STEPS)
    client = openai.OpenAI(base_url=f"{stack.url}/v1", api_key="sk-test", default_headers={"x-polar-session": session})
    messages: list[dict] = [{"role": "system", "content": "You are a coding agent."},
                            {"role": "user", "content": "Fix the bug in main.py."}]
    for _ in STEPS:
        message = client.chat.completions.create(model="gpt-5", messages=messages, tools=[READ]).choices[0].message
        echoed = message.model_dump(exclude_none=True)
        if not keep_reasoning:
            echoed.pop("reasoning", None), echoed.pop("reasoning_content", None)
        messages.append(echoed)
        for tc in message.tool_calls or []:
            messages.append({"role": "tool", "tool_call_id": tc.id, "content": '{"ok":true,"lines":3}'})
        if not message.tool_calls:
            messages.append({"role": "user", "content": "Yes, go ahead."})
    return stack.rows(session)
