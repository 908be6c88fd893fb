"""What harnesses send besides model calls, through a running polar: a right answer, no capture row.

Model listings and one model's card (the official SDKs' own `models.list`/`retrieve`/`get`), with the
upstream's context window where each API carries one; Ollama's `POST /api/show` (raw HTTP, as Hermes
Agent sends it, read the way Hermes reads it); Anthropic's count_tokens (a count row, never a failed
call); HEAD on each. None of the probes leaves an error row that reads like a failed model call.
"""

from __future__ import annotations

import uuid

import httpx
import pytest

WINDOW = 32768  # the double's max_model_len (tests/conftest.py double_server)
SERVED = "polar-tiny"  # the double's model name


@pytest.fixture
def session():
    return f"probe-{uuid.uuid4().hex[:8]}"


def no_rows(stack, session: str) -> None:
    assert stack.rows(session) == [], "a probe left a capture row"


def test_openai_listing_and_card(stack, session):
    import openai

    client = openai.OpenAI(base_url=f"{stack.url}/v1", api_key="sk", default_headers={"x-polar-session": session})
    listed = client.models.list().data
    assert [m.id for m in listed] == [SERVED]
    assert listed[0].model_extra["max_model_len"] == WINDOW  # vLLM's own field, which Hermes Agent reads
    card = client.models.retrieve("Qwen/Qwen3.5-4B")  # any name polar is asked for: it serves them all
    assert (card.id, card.object, card.model_extra["max_model_len"]) == ("Qwen/Qwen3.5-4B", "model", WINDOW)
    no_rows(stack, session)


def test_anthropic_listing_card_and_count(stack, session):
    import anthropic

    client = anthropic.Anthropic(base_url=stack.url, api_key="sk-ant", default_headers={"x-polar-session": session})
    page = client.models.list()
    assert [(m.id, m.type, m.max_input_tokens) for m in page.data] == [(SERVED, "model", WINDOW)]
    card = client.models.retrieve("claude-sonnet-4-5")
    assert (card.id, card.display_name, card.max_input_tokens, card.lifecycle) == (
        "claude-sonnet-4-5", "claude-sonnet-4-5", WINDOW, "active")
    no_rows(stack, session)

    messages = [{"role": "user", "content": "Count me, then answer me."}]
    counted = client.messages.count_tokens(model="claude-sonnet-4-5", system="Be terse.", messages=messages)
    stack.script(steps=[{"content": "Done."}])
    client.messages.create(model="claude-sonnet-4-5", max_tokens=64, system="Be terse.", messages=messages)
    count_row, call_row = stack.rows(session)
    # The count is the prompt the same conversation is then sampled on, token for token.
    assert counted.input_tokens == call_row["prompt_len"] > 0
    assert (count_row["endpoint"], count_row["status"], count_row["http_status"]) == ("count_tokens", "ok", 200)
    assert count_row["prompt_len"] is None and count_row["error"] is None  # a count, not a sample nor a failure


def test_gemini_listing_and_card(stack, session):
    from google import genai
    from google.genai import types

    client = genai.Client(api_key="gm", http_options=types.HttpOptions(base_url=stack.url,
                                                                       headers={"x-polar-session": session}))
    listed = list(client.models.list())
    assert [(m.name, m.input_token_limit) for m in listed] == [(f"models/{SERVED}", WINDOW)]
    card = client.models.get(model="gemini-2.5-pro")
    assert (card.name, card.input_token_limit) == ("models/gemini-2.5-pro", WINDOW)
    no_rows(stack, session)


def hermes_reads_context_length(data: dict) -> int | None:
    """How Hermes Agent reads an `/api/show` answer (agent/model_metadata.py, hermes-agent 0.19.0)."""
    for key, value in data.get("model_info", {}).items():
        if "context_length" in key and isinstance(value, int | float):
            return int(value)
    return None


def test_ollama_show(stack, session):
    headers = {"authorization": "Bearer x", "x-polar-session": session}
    with httpx.Client(base_url=stack.url, headers=headers, timeout=30) as http:
        for body in ({"name": "qwen3.5-4b"}, {"model": "qwen3.5-4b"}):  # older clients send `name`
            shown = http.post("/api/show", json=body)
            assert shown.status_code == 200, shown.text
            data = shown.json()
            assert hermes_reads_context_length(data) == WINDOW
            arch = data["model_info"]["general.architecture"]
            assert data["model_info"][f"{arch}.context_length"] == WINDOW  # the key Ollama's own clients read
            assert data["details"]["family"] == arch and "tools" in data["capabilities"]
        for body, status in ((b"{}", 400), (b"not json", 400)):
            refused = http.post("/api/show", content=body, headers={"content-type": "application/json"})
            assert refused.status_code == status and set(refused.json()) == {"error"}, refused.text
        assert http.post("/api/show", json={}).json() == {"error": "model is required"}
        wrong = http.get("/api/show")
        assert wrong.status_code == 405 and wrong.headers["allow"] == "POST, OPTIONS"
        assert http.get("/api/tags").status_code == 404  # not an Ollama server: its model list is refused
    no_rows(stack, session)


@pytest.mark.parametrize("path", ["/api/show", "/v1/models/Qwen/Qwen3.5-4B", "/v1beta/models/gemini-2.5-pro",
                                  "/api/tags", "/v1/messages/count_tokens"])
def test_head_is_get_without_a_body(stack, session, path):
    headers = {"x-polar-session": session}
    with httpx.Client(base_url=stack.url, headers=headers, timeout=30) as http:
        get, head = http.get(path), http.head(path)
    assert head.status_code == get.status_code and head.content == b""
    assert head.headers["content-length"] == str(len(get.content))
    no_rows(stack, session)
