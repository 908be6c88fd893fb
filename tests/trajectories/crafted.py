"""Crafted capture databases for the trajectory tests (tests/support/captures.Recorder), and a
real multi-turn session driven through polar with the official openai SDK."""

from __future__ import annotations

from tests.support.captures import Recorder  # noqa: F401  (the trajectory tests import it from here)


def conversation(task: str, rounds: int, tail: str = "tool") -> list[dict]:
    """Canonical messages: a task, `rounds` assistant turns each answered by `tail` ("tool" or "user")."""
    messages = [{"role": "system", "content": [{"text": "You are a coding agent."}]},
                {"role": "user", "content": [{"text": task}]}]
    for i in range(rounds):
        messages.append({"role": "assistant", "content": [{"text": f"step {i}"}]})
        messages.append({"role": tail, "content": [{"text": f"result {i}"}]})
    return messages


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
