"""A harness that sends the same request again (Hermes Agent does, on a retry or a repeated step) gets the earlier
call's prompt ids, token for token: a render would re-encode what was sampled."""

from __future__ import annotations

import uuid

import pytest

TOOLS = [{"type": "function", "function": {"name": "read_file", "description": "Read a file.",
                                           "parameters": {"type": "object", "properties": {"path": {"type": "string"}},
                                                          "required": ["path"]}}}]


@pytest.mark.parametrize("template_stack", ["qwen3.5-4b"], indirect=True)
def test_a_repeated_request_reuses_the_earlier_prompt_ids(template_stack):
    import openai

    stack = template_stack
    session = f"repeat-{uuid.uuid4().hex[:8]}"
    stack.script(rules=[{"match": "[session:repeat]", "steps": [
        {"reasoning": "Read the file first.", "content": "", "tool_calls": [{"name": "read_file",
                                                                            "arguments": {"path": "a.py"}}]},
        {"reasoning": "It is fine.", "content": "", "tool_calls": [{"name": "read_file",
                                                                   "arguments": {"path": "b.py"}}]},
        {"reasoning": "Still fine.", "content": "", "tool_calls": [{"name": "read_file",
                                                                   "arguments": {"path": "b.py"}}]},
        {"reasoning": "Once more.", "content": "", "tool_calls": [{"name": "read_file",
                                                                  "arguments": {"path": "b.py"}}]}]}])
    client = openai.OpenAI(base_url=f"{stack.url}/v1", api_key="sk", default_headers={"x-polar-session": session})
    extra = {"chat_template_kwargs": {"enable_thinking": True}}
    messages: list[dict] = [{"role": "user", "content": "Look at a.py. [session:repeat]"}]
    first = client.chat.completions.create(model="m", messages=messages, tools=TOOLS, extra_body=extra)
    msg = first.choices[0].message
    messages += [msg.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": msg.tool_calls[0].id, "content": "print('a')"}]
    for _ in range(3):  # the same request three times, as Hermes Agent sent it
        client.chat.completions.create(model="m", messages=messages, tools=TOOLS, extra_body=extra)

    rows = stack.rows(session)
    assert [r["status"] for r in rows] == ["ok"] * 4
    second, *repeats = rows[1:]
    assert second["prompt_mode"] == "token-faithful"
    full = rows[0]["prompt_ids"] + rows[0]["completion_ids"]
    assert second["prompt_ids"][: len(full)] == full  # the first answer's sampled ids, reasoning included
    earlier = {r["id"] for r in rows[1:]}
    for row in repeats:
        assert row["prompt_ids"] == second["prompt_ids"], row["prompt_mode"]
        assert row["prompt_mode"].startswith("token-faithful ("), row["prompt_mode"]
        assert int(row["prompt_mode"].rstrip(")").rsplit(" ", 1)[1]) in earlier - {row["id"]}

