"""Responses `previous_response_id`: polar continues from the stored call, within the same session only
(on each real chat template, token-faithful)."""

from __future__ import annotations

import json
import uuid

import openai
import pytest


def test_previous_response_id_continues_the_stored_conversation(template_stack):
    stack = template_stack
    stack.script(steps=[
        {"content": "", "tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]},
        {"content": "Sunny in Paris."},
    ])
    session = f"prev-{uuid.uuid4().hex[:6]}"
    client = openai.OpenAI(base_url=f"{stack.url}/v1", api_key="k", default_headers={"x-polar-session": session})
    tool = {"type": "function", "name": "get_weather", "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}}}}
    first = client.responses.create(model="gpt-x", input="Weather in Paris?", tools=[tool])
    call = next(i for i in first.output if i.type == "function_call")
    second = client.responses.create(model="gpt-x", previous_response_id=first.id, tools=[tool], input=[
        {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}])
    assert second.output_text == "Sunny in Paris."
    rows = stack.rows(session)
    messages = rows[1]["canonical"]["messages"]  # the stored request is the whole conversation
    assert [m["role"] for m in messages] == ["user", "assistant", "tool"]
    assert json.loads(messages[1]["tool_calls"][0]["arguments"]) == {"city": "Paris"}
    assert rows[1]["prompt_parent"] == rows[0]["id"]  # and its prompt extends the first call's tokens
    assert rows[1]["prompt_mode"].startswith("token-faithful"), rows[1]["prompt_mode"]
    full = rows[0]["prompt_ids"] + rows[0]["completion_ids"]
    assert rows[1]["prompt_ids"][: len(full)] == full
    stack.assert_served_with_template(rows)

    other = openai.OpenAI(base_url=f"{stack.url}/v1", api_key="k", default_headers={"x-polar-session": "someone-else"})
    with pytest.raises(openai.BadRequestError, match="not found"):
        other.responses.create(model="gpt-x", previous_response_id=first.id, input="and now?")
