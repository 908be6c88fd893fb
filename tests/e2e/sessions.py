"""Multi-turn agent sessions driven through polar by the official SDKs (test helpers).

Each driver plays a harness: it sends the conversation, executes the tool calls it gets back
with canned outputs, appends the assistant message exactly as its SDK returned it, and sends a
follow-up user message whenever the model answers without tools. The scripted double decides
what the "model" does at each turn (see SCRIPT).
"""

from __future__ import annotations

import json
from collections.abc import Callable

TOOLS = [
    {"name": "read_file", "description": "Read a file",
     "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}},
    {"name": "edit_file", "description": "Replace text in a file",
     "parameters": {"type": "object", "properties": {"path": {"type": "string"}, "old": {"type": "string"},
                                                     "new": {"type": "string"}}, "required": ["path", "old", "new"]}},
    {"name": "run", "description": "Run a shell command",
     "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}, "timeout": {"type": "integer"}},
                    "required": ["cmd"]}},
]
TASK = "Fix the failing test in this repository. [session:tf]"
FOLLOW_UPS = ["Now add a docstring to the function, s'il vous plaît — 谢谢.", "Continue.", "Summarise what you changed."]


def script_steps(thinking: bool) -> list[dict]:
    def r(text: str) -> str | None:
        return text if thinking else None

    return [
        {"reasoning": r("I should look at the code first."), "content": "",
         "tool_calls": [{"name": "read_file", "arguments": {"path": "src/app.py"}}]},
        {"reasoning": r("Run the tests and read them, in parallel."), "content": "Let me check both.",
         "tool_calls": [{"name": "run", "arguments": {"cmd": "pytest -q", "timeout": 60}},
                        {"name": "read_file", "arguments": {"path": "tests/test_app.py"}}]},
        {"reasoning": r("The bug: add() subtracts. Fix it."), "content": "Je corrige le bogue — 修复中 ✓",
         "tool_calls": [{"name": "edit_file", "arguments": {"path": "src/app.py", "old": "a-b", "new": "a+b"}}]},
        {"reasoning": r("Check again."), "content": "",
         "tool_calls": [{"name": "run", "arguments": {"cmd": "pytest -q", "timeout": 60}}]},
        {"reasoning": r("All green."), "content": "The test passes now: add() returned a-b."},
        # after the user's follow-up
        {"reasoning": r("Add the docstring."), "content": "",
         "tool_calls": [{"name": "edit_file", "arguments": {"path": "src/app.py", "old": "def add(a, b):",
                                                            "new": "def add(a, b):\n    \"\"\"Sum.\"\"\""}}]},
        # a turn longer than the client's max_tokens: truncated by the engine
        {"reasoning": r("Explain at length."), "content": "Here is a very long explanation. " * 600},
        # after "Continue."
        {"reasoning": r("Verify once more."), "content": "",
         "tool_calls": [{"name": "run", "arguments": {"cmd": "pytest -q", "timeout": 60}}]},
        {"reasoning": r("Done."), "content": "Done: the fix and the docstring are in."},
        # after "Summarise…"
        {"reasoning": r("Summarise."), "content": "",
         "tool_calls": [{"name": "read_file", "arguments": {"path": "src/app.py"}}]},
        {"reasoning": r("Final."), "content": "Changed `a-b` to `a+b` and documented add()."},
    ]


TURNS = 11  # model calls per session
Between = Callable[[int], None] | None  # called after each turn with its index
MAX_TOKENS = 400


def tool_output(name: str, args: dict) -> str:
    return {"read_file": f"# {args.get('path')}\ndef add(a, b):\n    return a-b\n",
            "edit_file": "ok", "run": "1 passed in 0.01s ✓"}[name]


def drive_anthropic(url: str, session: str, thinking: bool, between: Between = None) -> int:
    import anthropic

    client = anthropic.Anthropic(base_url=url, api_key="sk-ant", default_headers={"x-polar-session": session})
    tools = [{"name": t["name"], "description": t["description"], "input_schema": t["parameters"]} for t in TOOLS]
    kwargs: dict = dict(model="claude-sonnet-4-5", max_tokens=MAX_TOKENS, tools=tools)
    if thinking:
        kwargs.update(max_tokens=MAX_TOKENS + 1024, thinking={"type": "enabled", "budget_tokens": 1024})
    messages: list[dict] = [{"role": "user", "content": TASK}]
    follow = iter(FOLLOW_UPS)
    for turn in range(TURNS):
        with client.messages.stream(messages=messages, **kwargs) as s:
            msg = s.get_final_message()
        messages.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in msg.content]})
        calls = [b for b in msg.content if b.type == "tool_use"]
        if calls:
            messages.append({"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": c.id, "content": tool_output(c.name, c.input)} for c in calls]})
        else:
            messages.append({"role": "user", "content": next(follow, "Thanks.")})
        if between:
            between(turn)  # e.g. kill and restart the gateway between two turns
    return TURNS


# What Codex sends besides the task: `instructions`, developer items first, and developer items between turns.
INSTRUCTIONS = "You are a coding agent running in a terminal. Keep going until the task is done."
DEVELOPER_FIRST = ["<permissions instructions>sandbox: workspace-write</permissions instructions>",
                   "<environment_context>\n  <cwd>/work/repo</cwd>\n</environment_context>"]
DEVELOPER_LATER = "<environment_context>\n  <approval_policy>never</approval_policy>\n</environment_context>"
LATE_TURN = 2  # the developer item arrives with the tool output of this turn


def drive_chat(url: str, session: str, thinking: bool, turns: int = TURNS, between: Between = None, *,
               codex_like: bool = False) -> int:
    """`codex_like`: several system/developer messages first and a developer message mid-conversation."""
    import openai

    client = openai.OpenAI(base_url=f"{url}/v1", api_key="sk", default_headers={"x-polar-session": session})
    tools = [{"type": "function", "function": t} for t in TOOLS]
    extra = {"chat_template_kwargs": {"enable_thinking": thinking}}
    messages: list[dict] = [{"role": "user", "content": TASK}]
    if codex_like:
        messages[:0] = [{"role": "system", "content": INSTRUCTIONS},
                        *({"role": "developer", "content": text} for text in DEVELOPER_FIRST)]
    follow = iter(FOLLOW_UPS)
    for turn in range(turns):
        msg = client.chat.completions.create(model="gpt-5", messages=messages, tools=tools, max_tokens=MAX_TOKENS,
                                             extra_body=extra).choices[0].message
        messages.append(msg.model_dump(exclude_none=True))
        if msg.tool_calls:
            for c in msg.tool_calls:
                messages.append({"role": "tool", "tool_call_id": c.id,
                                 "content": tool_output(c.function.name, json.loads(c.function.arguments))})
        else:
            messages.append({"role": "user", "content": next(follow, "Thanks.")})
        if codex_like and turn == LATE_TURN:
            messages.append({"role": "developer", "content": DEVELOPER_LATER})
        if between:
            between(turn)  # e.g. kill and restart the gateway between two turns
    return turns


def drive_responses(url: str, session: str, thinking: bool, turns: int = TURNS, between: Between = None, *,
                    codex_like: bool = False) -> int:
    """`codex_like`: as Codex sends it, `instructions`, developer items first and a developer item mid-way."""
    import openai

    client = openai.OpenAI(base_url=f"{url}/v1", api_key="sk", default_headers={"x-polar-session": session})
    tools = [{"type": "function", "strict": False, **t} for t in TOOLS]
    kwargs: dict = dict(model="gpt-5-codex", tools=tools, store=False, max_output_tokens=MAX_TOKENS)
    if thinking:
        kwargs.update(include=["reasoning.encrypted_content"], reasoning={"effort": "medium", "summary": "auto"})
    else:
        kwargs.update(reasoning={"effort": "none"})
    items: list = [{"role": "user", "content": TASK}]
    if codex_like:
        kwargs["instructions"] = INSTRUCTIONS
        items[:0] = [{"role": "developer", "content": text} for text in DEVELOPER_FIRST]
    follow = iter(FOLLOW_UPS)
    for turn in range(turns):
        with client.responses.stream(input=items, **kwargs) as s:
            resp = s.get_final_response()
        # Codex-style: resend reasoning (encrypted_content), messages and calls as items.
        items += [i.model_dump(exclude_none=True) for i in resp.output]
        calls = [i for i in resp.output if i.type == "function_call"]
        for c in calls:
            items.append({"type": "function_call_output", "call_id": c.call_id,
                          "output": tool_output(c.name, json.loads(c.arguments))})
        if not calls:
            items.append({"role": "user", "content": next(follow, "Thanks.")})
        if codex_like and turn == LATE_TURN:
            items.append({"role": "developer", "content": DEVELOPER_LATER})
        if between:
            between(turn)  # e.g. kill and restart the gateway between two turns
    return turns


def drive_gemini(url: str, session: str, thinking: bool, between: Between = None) -> int:
    from google import genai
    from google.genai import types

    client = genai.Client(api_key="gm", http_options=types.HttpOptions(base_url=url, headers={"x-polar-session": session}))
    config = types.GenerateContentConfig(
        tools=[types.Tool(function_declarations=[types.FunctionDeclaration(**t) for t in TOOLS])],
        thinking_config=types.ThinkingConfig(include_thoughts=True) if thinking else types.ThinkingConfig(thinking_budget=0),
        max_output_tokens=MAX_TOKENS,
    )
    contents: list = [types.Content(role="user", parts=[types.Part(text=TASK)])]
    follow = iter(FOLLOW_UPS)
    for turn in range(TURNS):
        chunks = list(client.models.generate_content_stream(model="gemini-2.5-pro", contents=contents, config=config))
        parts = [p for c in chunks for p in (c.candidates[0].content.parts or [])]
        contents.append(types.Content(role="model", parts=parts))
        calls = [p.function_call for p in parts if p.function_call]
        if calls:
            contents.append(types.Content(role="user", parts=[
                types.Part(function_response=types.FunctionResponse(
                    name=c.name, id=c.id, response={"output": tool_output(c.name, dict(c.args))})) for c in calls]))
        else:
            contents.append(types.Content(role="user", parts=[types.Part(text=next(follow, "Thanks."))]))
        if between:
            between(turn)  # e.g. kill and restart the gateway between two turns
    return TURNS


DRIVERS: dict[str, Callable[[str, str, bool], int]] = {
    "anthropic": drive_anthropic,
    "openai_chat": drive_chat,
    "openai_responses": drive_responses,
    "gemini": drive_gemini,
}
