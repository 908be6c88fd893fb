"""Harnesses that edit their history between calls, replayed exactly as OpenClaw does it (official SDKs,
scripted double, each real template): every sampled turn must reach every later prompt id for id.

OpenClaw in its default configuration (../shared/reference/harnesses.md) ends every request with a
runtime-context user message that moves to the end on the next call, so no call extends the last; on
Chat and Gemini it replays tool-call ids with non-alphanumerics stripped (`call_ab12` → `callab12`).
Anthropic ids come back intact. The figures the issue asks for per harness: the share of calls that
extend the last and the share of sampled tokens that reach the later prompts unchanged. Spliced (the
gateway's default), no call extends the last and every call is its own trajectory; with the session's
`dropped_messages` set to keep (what the OpenClaw shortcut declares), the moved messages stay where the
model saw them, every call extends the last and the session is one trajectory.
"""

from __future__ import annotations

import json
import re
import uuid
from itertools import pairwise

import pytest

from polar.datasets.chat import chat_row
from polar.datasets.select import Candidate
from polar.rollout.tasks import SessionResult
from polar.sessions.splice import KEPT, SPLICED
from polar.trajectories.builders import prefix_merge
from tests.support.scheduling import matrix_subset

pytestmark = pytest.mark.slow  # outside scripts/test_fast: processes killed and restarted, or many started

SYSTEM = "You are a personal assistant running inside OpenClaw. Use the exec tool to run shell commands."
TASK = "How many files are in /work? Use exec."
EXEC = {"name": "exec", "description": "Run a shell command",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}
STEPS = [
    {"content": "Listing.", "tool_calls": [{"name": "exec", "arguments": {"command": "ls /work"}}]},
    {"reasoning": "Two names; count them.", "content": "",
     "tool_calls": [{"name": "exec", "arguments": {"command": "ls /work | wc -l"}}]},
    {"content": "There are 2 files in /work."},
]
CALLS = len(STEPS)


def runtime_context(n: int) -> str:
    """OpenClaw's runtime-context message: it changes and moves to the end on every call."""
    return f"[runtime context] Active exec sessions: {n}\nActive Subagents: none\n(openclaw-{n})"


def strip(call_id: str) -> str:
    return re.sub(r"[^0-9A-Za-z]", "", call_id)


def occurs(needle: list[int], hay: list[int]) -> bool:
    """`needle` appears in `hay` as one contiguous run of ids."""
    n = len(needle)
    return any(hay[i:i + n] == needle for i in range(len(hay) - n + 1))


def figures(rows: list[dict]) -> tuple[float, float]:
    """(share of calls after the first whose prompt starts with the last call's prompt + sample,
    share of sampled tokens whose exact ids reach every later prompt)."""
    extend = [r["prompt_ids"][: len(p["prompt_ids"]) + len(p["completion_ids"])] == p["prompt_ids"] + p["completion_ids"]
              for p, r in pairwise(rows)]
    carried = sum(len(r["completion_ids"]) for i, r in enumerate(rows[:-1])
                  if all(occurs(r["completion_ids"], later["prompt_ids"]) for later in rows[i + 1:]))
    sampled = sum(len(r["completion_ids"]) for r in rows[:-1])
    return sum(extend) / len(extend), carried / sampled


def drive_chat(url: str, session: str) -> None:
    import openai

    client = openai.OpenAI(base_url=f"{url}/v1", api_key="sk", default_headers={"x-polar-session": session})
    history: list[dict] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": TASK}]
    for n in range(CALLS):
        history += chat_turn(client, [*history, {"role": "user", "content": runtime_context(n)}], n)


def chat_turn(client, messages: list[dict], n: int) -> list[dict]:
    """One Chat call, and what OpenClaw replays of it: reasoning dropped, ids stripped."""
    message = client.chat.completions.create(model="qwen", messages=messages,
                                             tools=[{"type": "function", "function": EXEC}]).choices[0].message
    calls = message.tool_calls or []
    replayed = [{"id": strip(c.id), "type": "function",
                 "function": {"name": c.function.name, "arguments": c.function.arguments}} for c in calls]
    answer = {"role": "assistant", "content": message.content or "", **({"tool_calls": replayed} if calls else {})}
    return [answer, *({"role": "tool", "tool_call_id": strip(c.id), "content": f"out-{n}"} for c in calls)]


def drive_gemini(url: str, session: str) -> None:
    from google import genai
    from google.genai import types

    client = genai.Client(api_key="gm", http_options=types.HttpOptions(base_url=url, headers={"x-polar-session": session}))
    config = types.GenerateContentConfig(system_instruction=SYSTEM,
                                         tools=[types.Tool(function_declarations=[types.FunctionDeclaration(**EXEC)])])
    history: list[types.Content] = [types.Content(role="user", parts=[types.Part(text=TASK)])]
    for n in range(CALLS):
        contents = [*history, types.Content(role="user", parts=[types.Part(text=runtime_context(n))])]
        parts = client.models.generate_content(model="gemini-x", contents=contents, config=config).candidates[0].content.parts
        calls = [p.function_call for p in parts if p.function_call]
        replayed = [types.Part(text=p.text) for p in parts if p.text and not p.thought]
        replayed += [types.Part(function_call=types.FunctionCall(id=strip(c.id), name=c.name, args=c.args)) for c in calls]
        history.append(types.Content(role="model", parts=replayed))
        if calls:
            history.append(types.Content(role="user", parts=[types.Part(function_response=types.FunctionResponse(
                id=strip(c.id), name=c.name, response={"output": f"out-{n}"})) for c in calls]))


def drive_anthropic(url: str, session: str) -> None:
    import anthropic

    client = anthropic.Anthropic(base_url=url, api_key="sk-ant", default_headers={"x-polar-session": session})
    tools = [{"name": EXEC["name"], "description": EXEC["description"], "input_schema": EXEC["parameters"]}]
    history: list[dict] = [{"role": "user", "content": TASK}]
    for n in range(CALLS):
        messages = [*history, {"role": "user", "content": runtime_context(n)}]
        message = client.messages.create(model="claude-x", max_tokens=1024, system=SYSTEM, tools=tools,
                                         messages=messages)
        history.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in message.content]})
        results = [{"type": "tool_result", "tool_use_id": b.id, "content": f"out-{n}"}
                   for b in message.content if b.type == "tool_use"]
        if results:
            history.append({"role": "user", "content": results})


DRIVERS = {"openai_chat": drive_chat, "gemini": drive_gemini, "anthropic": drive_anthropic}


def _qwen35_or_chat(params) -> bool:
    """CI: every API on Qwen3.5, Chat on the other templates (scripts/test_matrix runs them all)."""
    return params["template_stack"] == "qwen3.5-4b" or params["provider"] == "openai_chat"


@matrix_subset(_qwen35_or_chat)
@pytest.mark.parametrize("provider", list(DRIVERS))
@pytest.mark.parametrize("dropped", ["splice", "keep"])
def test_moving_context_and_stripped_ids_keep_every_sampled_turn(template_stack, provider, dropped):
    stack = template_stack
    session = f"claw-{stack.template}-{provider}-{dropped}-{uuid.uuid4().hex[:6]}"
    if dropped == "keep":  # as a rollout node does for a harness declaring it (the gateway's option otherwise)
        stack.proxy.addon.gateway.registry.set_dropped_messages(session, "keep")
    stack.script(rules=[{"match": "[runtime context]", "steps": STEPS}])
    DRIVERS[provider](stack.url, session)

    rows = stack.rows(session)
    assert len(rows) == CALLS and all(r["status"] == "ok" for r in rows), [(r["status"], r["error"]) for r in rows]
    stack.assert_served_with_template(rows)
    for row in rows[1:]:
        assert row["prompt_mode"] == f"token-faithful ({SPLICED if dropped == 'splice' else KEPT})", row["prompt_mode"]
    for i, row in enumerate(rows[:-1]):
        for later in rows[i + 1:]:
            assert occurs(row["completion_ids"], later["prompt_ids"]), (i, later["id"])  # never re-encoded
    extend, carried = figures(rows)
    trajectories = prefix_merge(rows)
    if dropped == "splice":
        assert (extend, carried, len(trajectories)) == (0.0, 1.0, CALLS)
    else:
        assert (extend, carried, len(trajectories)) == (1.0, 1.0, 1)
        (trajectory,) = trajectories
        last = rows[-1]
        assert trajectory.token_ids == last["prompt_ids"] + last["completion_ids"]
        assert trajectory.sampled_ids() == [i for r in rows for i in r["completion_ids"]]
        # every snapshot the harness sent is in the model's view, in the order it was sent
        text = stack.double.tokenizer.decode(last["prompt_ids"])
        positions = [text.find(runtime_context(n)) for n in range(CALLS)]
        assert -1 not in positions and positions == sorted(positions), positions
        # its chat-format row holds the messages the model saw, in that order, the sampled turns marked
        row = chat_row(Candidate(trajectory, SessionResult(session_id=session, task_id="claw", sample=0, outcome="ok")),
                       {r["id"]: r for r in rows})
        seen = ["system", "user"] + ["user", "assistant", "tool"] * (CALLS - 1) + ["user", "assistant"]
        assert [m["role"] for m in row["messages"]] == seen
        assert [m["content"] for m in row["messages"][2::3]] == [runtime_context(n) for n in range(CALLS)]
        assert [m["train"] for m in row["messages"]] == [r == "assistant" for r in seen]
    print(json.dumps({"harness": "openclaw-like", "provider": provider, "template": stack.template,
                      "dropped_messages": dropped, "calls_extending_the_last": extend,
                      "sampled_tokens_reaching_later_prompts": carried, "trajectories": len(trajectories)}))


def test_the_gateway_option_keeps_dropped_messages_unless_the_session_says_otherwise(stack):
    """`--dropped-messages keep` for every session; a runtime's per-session setting wins over it."""
    import asyncio

    def set_option(value: str) -> None:
        async def update() -> None:
            stack.proxy.master.options.update(polar_dropped_messages=value)

        asyncio.run_coroutine_threadsafe(update(), stack.proxy.master.event_loop).result(60)

    stack.script(rules=[{"match": "[runtime context]", "steps": STEPS}])
    set_option("keep")
    try:
        sessions = {policy: f"claw-option-{policy}-{uuid.uuid4().hex[:6]}" for policy in ("keep", "splice")}
        stack.proxy.addon.gateway.registry.set_dropped_messages(sessions["splice"], "splice")
        for session in sessions.values():
            drive_chat(stack.url, session)
    finally:
        set_option("splice")
    for policy, session in sessions.items():
        rows = stack.rows(session)
        assert [r["prompt_mode"] for r in rows[1:]] == [f"token-faithful ({KEPT if policy == 'keep' else SPLICED})"] * 2
        assert len(prefix_merge(rows)) == (1 if policy == "keep" else CALLS)


def test_stripped_ids_alone_still_extend(template_stack):
    """Without the moving message, a harness that only strips ids extends every call (fingerprints ignore
    the id's punctuation)."""
    import openai

    stack = template_stack
    session = f"ids-{stack.template}-{uuid.uuid4().hex[:6]}"
    stack.script(rules=[{"match": TASK, "steps": STEPS}])
    client = openai.OpenAI(base_url=f"{stack.url}/v1", api_key="sk", default_headers={"x-polar-session": session})
    messages: list[dict] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": TASK}]
    for n in range(CALLS):
        messages += chat_turn(client, messages, n)
    rows = stack.rows(session)
    assert [r["prompt_mode"] for r in rows[1:]] == ["token-faithful"] * (CALLS - 1)
    assert figures(rows) == (1.0, 1.0)
