"""The double's streams tell the same sample as its plain answers, on every endpoint and template family.

Same token ids, logprobs, finish, usage and prompt ids; the streamed reasoning, content and tool calls
reassemble into the plain message (up to the whitespace vLLM's own streaming parsers keep and its
non-streaming parse strips); and each chunk sits where vLLM puts it: the role chunk first, prompt ids
on the first chunk only, the finish on the last token's chunk, then the usage chunk and [DONE].
"""

from __future__ import annotations

import json

import pytest

from tests.conftest import SHARED_TEMPLATES, real_template
from tests.doubles.conftest import read_stream
from tests.support.real_vllm import TOOLS

TEMPLATES = ["own", *SHARED_TEMPLATES]
ANSWERS = {
    "text": {"reasoning": "Short.", "content": "Plain text — ünïcödé 中文 🚀"},
    "call": {"reasoning": "Let me look.", "content": "Reading it.",
             "tool_calls": [{"name": "read_file", "arguments": {"path": "README.md", "limit": 20}}]},
    "parallel": {"tool_calls": [{"name": "read_file", "arguments": {"path": "a b\nc.py"}},
                                {"name": "read_file", "arguments": {"limit": 5, "path": "b.py"}}]},
}
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Show me the README"}]


def use(client, template: str, answer: dict | None = None) -> None:
    path = None if template == "own" else str(real_template(template))
    client.post("/_double/template", json={"chat_template": path}).raise_for_status()
    if answer is not None:
        client.post("/_double/script", json={"steps": [answer]}).raise_for_status()


def assemble(chunks: list[dict]) -> dict:
    """What a client makes of a chat stream: the message, ids, logprobs, finish and usage."""
    out = {"reasoning": "", "content": "", "calls": [], "ids": [], "logprobs": [], "finish": None, "stop_reason": None,
           "usage": None, "prompt_ids": None}
    for chunk in chunks:
        if chunk.get("prompt_token_ids") is not None:
            assert out["prompt_ids"] is None, "prompt ids come on the first chunk only"
            out["prompt_ids"] = chunk["prompt_token_ids"]
        if not chunk["choices"]:
            out["usage"] = chunk["usage"]
        for choice in chunk["choices"]:
            delta = choice["delta"]
            out["reasoning"] += delta.get("reasoning") or ""
            out["content"] += delta.get("content") or ""
            for call in delta.get("tool_calls", []):
                if "id" in call:
                    assert call["index"] == len(out["calls"]) and call["type"] == "function"
                    out["calls"].append({"name": call["function"]["name"], "arguments": ""})
                out["calls"][call["index"]]["arguments"] += call["function"].get("arguments") or ""
            out["ids"] += choice.get("token_ids") or []
            out["logprobs"] += (choice.get("logprobs") or {}).get("content") or []
            if choice["finish_reason"]:
                out["finish"], out["stop_reason"] = choice["finish_reason"], choice["stop_reason"]
    return out


def plain_usage(usage: dict) -> dict:
    return {k: v for k, v in usage.items() if v is not None}  # the usage chunk leaves out the nulls


@pytest.mark.parametrize("answer", list(ANSWERS))
@pytest.mark.parametrize("thinking", [True, False], ids=["thinking", "no-thinking"])
@pytest.mark.parametrize("template", TEMPLATES)
def test_chat_stream_is_the_plain_answer(double, template, thinking, answer):
    _, client = double
    use(client, template, ANSWERS[answer])
    body = {"model": "polar-tiny", "messages": MESSAGES, "tools": TOOLS, "return_token_ids": True, "logprobs": True,
            "top_logprobs": 2, "chat_template_kwargs": {"enable_thinking": thinking},
            "stream_options": {"include_usage": True}}
    plain = client.post("/v1/chat/completions", json={**body, "stream_options": None}).json()
    streamed = read_stream(client, "/v1/chat/completions", body)
    got, choice, message = assemble(streamed.chunks), plain["choices"][0], plain["choices"][0]["message"]

    assert streamed.done and streamed.events.count(None) == 1
    assert streamed.chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert got["prompt_ids"] == plain["prompt_token_ids"]
    assert got["ids"] == choice["token_ids"]
    assert got["logprobs"] == choice["logprobs"]["content"]
    assert (got["finish"], got["stop_reason"]) == (choice["finish_reason"], choice["stop_reason"])
    assert got["usage"] == plain_usage(plain["usage"])
    assert [(c["name"], c["arguments"]) for c in got["calls"]] == [
        (c["function"]["name"], c["function"]["arguments"]) for c in message.get("tool_calls", [])]
    assert got["reasoning"].strip() == (message["reasoning"] or "").strip()
    assert got["content"].strip() == (message["content"] or "").strip()
    # every sampled token has its chunk here (return_token_ids), the last one carrying the finish
    token_chunks = [c for c in streamed.chunks[1:] if c["choices"]]
    assert [len(c["choices"][0]["token_ids"]) for c in token_chunks] == [1] * len(choice["token_ids"])
    assert [c["choices"][0]["finish_reason"] is not None for c in token_chunks] == [False] * (len(token_chunks) - 1) + [True]


@pytest.mark.parametrize("cut", ["stop-string", "max-tokens"])
def test_chat_stream_cuts_as_the_plain_answer(double, cut):
    _, client = double
    use(client, "own", {"content": "Hello there. Bye now."})
    body = {"model": "polar-tiny", "messages": MESSAGES, "chat_template_kwargs": {"enable_thinking": False},
            "return_token_ids": True}
    body |= {"stop": ["there", "zzz"]} if cut == "stop-string" else {"max_tokens": 3}
    plain = client.post("/v1/chat/completions", json=body).json()["choices"][0]
    got = assemble(read_stream(client, "/v1/chat/completions", body).chunks)
    assert (got["ids"], got["content"], got["finish"], got["stop_reason"]) == (
        plain["token_ids"], plain["message"]["content"], plain["finish_reason"], plain["stop_reason"])
    assert got["finish"] == ("stop" if cut == "stop-string" else "length")


def test_chat_stream_without_ids_or_logprobs_sends_only_what_the_parsers_let_out(double):
    _, client = double
    use(client, "own", ANSWERS["call"])
    body = {"model": "polar-tiny", "messages": MESSAGES, "tools": TOOLS}
    streamed = read_stream(client, "/v1/chat/completions", body)
    middle = [c["choices"][0] for c in streamed.chunks[1:-1]]
    assert middle and all(choice["delta"] and choice["token_ids"] is None and choice["logprobs"] is None
                          for choice in middle)
    final = streamed.chunks[-1]
    assert final["choices"][0]["finish_reason"] == "tool_calls" and final["system_fingerprint"]


def test_continuous_usage_counts_as_it_goes(double):
    _, client = double
    use(client, "own", ANSWERS["text"])
    body = {"model": "polar-tiny", "messages": MESSAGES, "return_token_ids": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    chunks = read_stream(client, "/v1/chat/completions", body).chunks
    counts = [c["usage"]["completion_tokens"] for c in chunks]
    assert counts == [*range(len(chunks) - 1), len(chunks) - 2]  # role chunk 0, one per token, then the total
    reasoning = [c["usage"]["completion_tokens_details"]["reasoning_tokens"] for c in chunks]
    assert reasoning == sorted(reasoning) and 0 < reasoning[-1] < counts[-1]


def prompt_of(client, template: str) -> list[int]:
    body = {"model": "polar-tiny", "messages": MESSAGES, "tools": TOOLS, "add_generation_prompt": True}
    return client.post("/tokenize", json=body).json()["tokens"]


@pytest.mark.parametrize("template", TEMPLATES)
def test_completions_stream_is_the_plain_answer(double, template):
    _, client = double
    use(client, template, ANSWERS["call"])
    prompt = prompt_of(client, template)
    body = {"model": "polar-tiny", "prompt": prompt, "max_tokens": 200, "logprobs": 1, "return_token_ids": True,
            "stream_options": {"include_usage": True}}
    plain = client.post("/v1/completions", json={**body, "stream_options": None}).json()
    streamed = read_stream(client, "/v1/completions", body)
    choices = [c["choices"][0] for c in streamed.chunks if c["choices"]]
    choice = plain["choices"][0]
    assert [c["prompt_token_ids"] for c in choices] == [prompt] + [None] * (len(choices) - 1)
    assert sum((c["token_ids"] for c in choices), []) == choice["token_ids"]
    assert "".join(c["text"] for c in choices) == choice["text"]
    for key in ("text_offset", "token_logprobs", "tokens", "top_logprobs"):
        assert sum((c["logprobs"][key] for c in choices), []) == choice["logprobs"][key]
    assert (choices[-1]["finish_reason"], choices[-1]["stop_reason"]) == (choice["finish_reason"], choice["stop_reason"])
    assert streamed.chunks[-1]["usage"] == plain_usage({**plain["usage"], "completion_tokens_details": None})
    assert streamed.done


@pytest.mark.parametrize("template", TEMPLATES)
def test_generate_stream_is_the_plain_answer(double, template):
    _, client = double
    use(client, template, ANSWERS["parallel"])
    prompt = prompt_of(client, template)
    body = {"model": "polar-tiny", "token_ids": prompt, "return_token_ids": True, "output_mode": "tokens",
            "sampling_params": {"max_tokens": 300, "temperature": 0, "logprobs": 0},
            "stream_options": {"include_usage": True}}
    plain = client.post("/inference/v1/generate", json=body).json()
    streamed = read_stream(client, "/inference/v1/generate", body)
    token_chunks = [c for c in streamed.chunks if c["choices"]]
    choices = [c["choices"][0] for c in token_chunks]
    choice = plain["choices"][0]
    assert token_chunks[0]["prompt_token_ids"] == prompt == plain["prompt_token_ids"]
    assert all("prompt_token_ids" not in c for c in token_chunks[1:])
    assert sum((c["token_ids"] for c in choices), []) == choice["token_ids"]
    assert sum((c["logprobs"]["content"] for c in choices), []) == choice["logprobs"]["content"]
    assert [c["weight_versions"] for c in choices[:-1]] == [None] * (len(choices) - 1)
    assert choices[-1]["weight_versions"] == choice["weight_versions"]
    assert (choices[-1]["finish_reason"], choices[-1]["stop_reason"]) == (choice["finish_reason"], choice["stop_reason"])
    assert streamed.chunks[-1]["usage"] == plain_usage({**plain["usage"], "completion_tokens_details": None})
    assert json.dumps(streamed.chunks[-1]).startswith('{"request_id"') and streamed.done


def test_errors_before_the_stream_are_plain_json(double):
    _, client = double
    response = client.post("/v1/chat/completions", json={"model": "nope", "messages": [], "stream": True})
    assert response.status_code == 404 and response.json()["error"]["type"] == "NotFoundError"
