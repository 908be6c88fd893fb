"""The scripted vLLM double against the real vLLM, on the same requests.

The double stands in for vLLM in the fast tests, so its wire format must be vLLM's: same JSON
structure (keys and value types, recursively; sampled values aside), same prompt token ids (both
render the same chat template with the same tokenizer, from the same model directory), same
parse of sampled text into reasoning / content / tool calls, and the same error statuses, types,
params and, where vLLM's text is fixed, messages.

The real model's text is noise, so where values matter the real vLLM is made to write a given
answer with `structured_outputs` (a regex over the output) and the double is scripted to the same.
"""

from __future__ import annotations

import functools
import json
import re

import httpx
import pytest

from tests.support.real_vllm import EOS, MAX_MODEL_LEN, SERVED_MODEL, TOOLS

pytestmark = pytest.mark.vllm

# A conversation with history: reasoning, a tool call with JSON-text arguments, its result, non-ASCII text.
CONVERSATION = [
    {"role": "system", "content": "You are a coding agent. Be brief."},
    {"role": "user", "content": "Show me the README — ünïcödé, 中文, 🚀"},
    {
        "role": "assistant", "content": "Reading it.", "reasoning_content": "The user wants the README.",
        "tool_calls": [{"id": "call_1", "type": "function",
                        "function": {"name": "read_file", "arguments": '{"path": "README.md", "limit": 20}'}}],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "# polar\nA toolkit."},
    {"role": "user", "content": "Summarise it."},
]
TOKEN_BODY = {"return_token_ids": True, "logprobs": True}  # what polar asks of the chat endpoint


@pytest.fixture(scope="module")
def double(model_dir):
    """The double on the served model's own directory: the same tokenizer and chat template as vLLM's."""
    from polar.doubles.scripted_vllm import BackgroundServer, ScriptedVLLM

    server = BackgroundServer(ScriptedVLLM(model_dir, SERVED_MODEL, max_model_len=MAX_MODEL_LEN).app)
    url = server.start()
    with httpx.Client(base_url=url, timeout=120) as client:
        yield client
    server.stop()


@pytest.fixture(scope="module")
def tokenizer(model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_dir))


@pytest.fixture(scope="module")
def real(vllm_url):
    with httpx.Client(base_url=vllm_url, timeout=300) as client:
        yield client


def both(double, real, path: str, body: dict | list | bytes | None = None) -> tuple[httpx.Response, httpx.Response]:
    """The same request to the double and to vLLM: GET without a body, else POST (bytes are sent as they are)."""
    if body is None:
        return double.get(path), real.get(path)
    if isinstance(body, bytes):
        send = {"content": body, "headers": {"content-type": "application/json"}}
    else:
        send = {"json": body}
    return double.post(path, **send), real.post(path, **send)


def script(double, **step) -> None:
    double.post("/_double/script", json={"steps": [step]}).raise_for_status()


def skeleton(value):
    """The JSON structure: dict keys and value types, recursively; a list's elements merged into one structure."""
    if isinstance(value, dict):
        return {key: skeleton(item) for key, item in value.items()}
    if isinstance(value, list):
        shapes = [skeleton(item) for item in value]
        return [functools.reduce(merge, shapes)] if shapes else []
    return type(value).__name__


def merge(a, b):
    """One structure for two list elements: an empty list fits any list; other mismatches show as `x|y`."""
    if isinstance(a, dict) and isinstance(b, dict):
        return {key: merge(a[key], b[key]) if key in a and key in b else a.get(key, b.get(key)) for key in a | b}
    if isinstance(a, list) and isinstance(b, list):
        return a if not b else b if not a else [merge(a[0], b[0])]
    return a if a == b else "|".join(sorted({str(a), str(b)}))


def differences(mine, theirs, path: str = "$") -> list[str]:
    """Where two skeletons differ, as readable paths (for assertion messages)."""
    if isinstance(mine, dict) and isinstance(theirs, dict):
        out = [f"{path}.{k}: only in the double" for k in mine.keys() - theirs.keys()]
        out += [f"{path}.{k}: only in vLLM" for k in theirs.keys() - mine.keys()]
        for key in mine.keys() & theirs.keys():
            out += differences(mine[key], theirs[key], f"{path}.{key}")
        return out
    if isinstance(mine, list) and isinstance(theirs, list) and len(mine) == len(theirs) == 1:
        return differences(mine[0], theirs[0], f"{path}[]")
    return [] if mine == theirs else [f"{path}: double {mine} != vLLM {theirs}"]


def assert_same_shape(mine: dict, theirs: dict) -> None:
    diff = differences(skeleton(mine), skeleton(theirs))
    assert not diff, "\n".join(sorted(diff))


def mimic(message: dict) -> dict:
    """A script step that makes the double answer what vLLM's message holds."""
    calls = [{"name": c["function"]["name"], "arguments": json.loads(c["function"]["arguments"])}
             for c in message.get("tool_calls") or []]
    return {"reasoning": message["reasoning"], "content": message["content"] or "", "tool_calls": calls}


# -- the catalogue ----------------------------------------------------------------------------


def test_models(double, real):
    mine, theirs = both(double, real, "/v1/models")
    assert mine.status_code == theirs.status_code == 200
    assert_same_shape(mine.json(), theirs.json())
    for key in ("id", "object", "owned_by", "max_model_len", "root"):  # polar reads id and max_model_len
        assert mine.json()["data"][0][key] == theirs.json()["data"][0][key]


# -- chat completions with token ids --------------------------------------------------------


@pytest.mark.parametrize("thinking", [None, True, False], ids=["default", "thinking", "no-thinking"])
@pytest.mark.parametrize("tools", [False, True], ids=["plain", "tools"])
def test_chat_with_token_ids(double, real, tokenizer, tools, thinking):
    from polar.doubles.scripted_vllm import parse_completion

    body = {"model": SERVED_MODEL, "messages": CONVERSATION if tools else CONVERSATION[-1:], "max_tokens": 8,
            "temperature": 0, **TOKEN_BODY}
    if tools:
        body["tools"] = TOOLS
    if thinking is not None:
        body["chat_template_kwargs"] = {"enable_thinking": thinking}
    theirs = real.post("/v1/chat/completions", json=body)
    assert theirs.status_code == 200, theirs.text
    vllm = theirs.json()
    script(double, **mimic(vllm["choices"][0]["message"]))
    mine = double.post("/v1/chat/completions", json=body)
    assert mine.status_code == 200, mine.text
    assert_same_shape(mine.json(), vllm)
    assert mine.json()["prompt_token_ids"] == vllm["prompt_token_ids"]
    assert mine.json()["usage"]["prompt_tokens"] == vllm["usage"]["prompt_tokens"]

    # The double's parser reads vLLM's real sample as vLLM's reasoning and tool parsers did.
    choice = vllm["choices"][0]
    sampled = choice["token_ids"][:-1] if choice["token_ids"][-1] == EOS else choice["token_ids"]
    reasoning, content, calls = parse_completion(tokenizer.decode(sampled), thinking is not False, TOOLS if tools else [])
    assert (reasoning or None, content or None) == (choice["message"]["reasoning"], choice["message"]["content"] or None)
    assert calls == []


ANSWERS = {
    "call": ("", [{"name": "read_file", "arguments": {"path": "README.md", "limit": 20}}]),
    "text-and-call": ("Je le lis — 中文 ✓", [{"name": "read_file", "arguments": {"path": "docs/ü 中文.md"}}]),
    "parallel": ("", [{"name": "read_file", "arguments": {"path": "a.py"}},
                      {"name": "read_file", "arguments": {"path": "b.py", "limit": 5}}]),
}


@pytest.mark.parametrize("answer", list(ANSWERS))
def test_chat_tool_calls_parse_alike(double, real, answer):
    """vLLM made to write a given Qwen3.5 answer; the double scripted to the same: equal messages."""
    from polar.doubles.scripted_vllm import Step, render_completion

    content, calls = ANSWERS[answer]
    text = render_completion(Step(content=content, tool_calls=calls), thinking=False)
    body = {"model": SERVED_MODEL, "messages": CONVERSATION[:2], "tools": TOOLS, "max_tokens": 200, "temperature": 0,
            "chat_template_kwargs": {"enable_thinking": False}, **TOKEN_BODY}
    theirs = real.post("/v1/chat/completions", json={**body, "structured_outputs": {"regex": re.escape(text)}})
    assert theirs.status_code == 200, theirs.text
    script(double, content=content, tool_calls=calls)
    mine = double.post("/v1/chat/completions", json=body)
    assert mine.status_code == 200, mine.text
    assert_same_shape(mine.json(), theirs.json())
    ours, vllm = mine.json()["choices"][0], theirs.json()["choices"][0]
    assert vllm["finish_reason"] == ours["finish_reason"] == "tool_calls"
    assert vllm["token_ids"][-1] == ours["token_ids"][-1] == EOS
    assert ours["message"]["content"] == vllm["message"]["content"]
    assert ours["message"]["reasoning"] == vllm["message"]["reasoning"] is None
    for mine_call, vllm_call in zip(ours["message"]["tool_calls"], vllm["message"]["tool_calls"], strict=True):
        assert all(re.fullmatch(r"chatcmpl-tool-[0-9a-f]{16}", call["id"]) for call in (mine_call, vllm_call))
        assert mine_call["function"] == vllm_call["function"]  # the arguments JSON text too, byte for byte


# -- token-level endpoints ------------------------------------------------------------------


@pytest.fixture(scope="module")
def prompt_ids(real):
    body = {"model": SERVED_MODEL, "messages": CONVERSATION, "tools": TOOLS, "add_generation_prompt": True}
    return real.post("/tokenize", json=body).json()["tokens"]


def test_completions_with_a_token_prompt(double, real, prompt_ids):
    body = {"model": SERVED_MODEL, "prompt": prompt_ids, "max_tokens": 6, "temperature": 0, "logprobs": 0,
            "return_token_ids": True, "skip_special_tokens": False}
    mine, theirs = both(double, real, "/v1/completions", body)
    assert mine.status_code == theirs.status_code == 200, (mine.text, theirs.text)
    # In this layout the top-logprob dicts are keyed by token text: compare their values' structure.
    normal = [{**r.json(), "choices": [_legacy_keys(c) for c in r.json()["choices"]]} for r in (mine, theirs)]
    assert_same_shape(*normal)
    for response in (mine.json(), theirs.json()):
        choice = response["choices"][0]
        assert choice["prompt_token_ids"] == prompt_ids and "prompt_token_ids" not in response
        assert len(choice["token_ids"]) == len(choice["logprobs"]["token_logprobs"]) == 6


def _legacy_keys(choice: dict) -> dict:
    logprobs = dict(choice["logprobs"])
    logprobs["top_logprobs"] = [list(d.values()) for d in logprobs["top_logprobs"]]
    return {**choice, "logprobs": logprobs}


def test_generate_with_a_token_prompt(double, real, prompt_ids):
    body = {"model": SERVED_MODEL, "token_ids": prompt_ids, "output_mode": "tokens", "return_token_ids": True,
            "sampling_params": {"max_tokens": 6, "temperature": 0, "logprobs": 0}}
    mine, theirs = both(double, real, "/inference/v1/generate", body)
    assert mine.status_code == theirs.status_code == 200, (mine.text, theirs.text)
    assert_same_shape(mine.json(), theirs.json())
    for response in (mine.json(), theirs.json()):
        assert response["prompt_token_ids"] == prompt_ids
        choice = response["choices"][0]
        assert [e["token_id"] for e in choice["logprobs"]["content"]] == choice["token_ids"]
        assert [e["rank"] for e in choice["logprobs"]["content"]] == [1] * 6  # greedy: the sampled token is the top one
        assert choice["weight_versions"] == [{"version": "default", "start": 0, "end": 6}]

    # polar finds the endpoint by posting an empty body: both must refuse it as a bad request, not 404.
    mine, theirs = both(double, real, "/inference/v1/generate", {})
    assert mine.status_code == theirs.status_code == 400
    assert mine.json()["error"]["param"] == theirs.json()["error"]["param"] == "body.token_ids"


@pytest.mark.parametrize("thinking", [True, False], ids=["thinking", "no-thinking"])
def test_tokenize_messages_with_tools(double, real, thinking):
    body = {"model": SERVED_MODEL, "messages": CONVERSATION, "tools": TOOLS, "add_generation_prompt": True,
            "chat_template_kwargs": {"enable_thinking": thinking}}
    mine, theirs = both(double, real, "/tokenize", body)
    assert mine.status_code == theirs.status_code == 200
    assert mine.json() == theirs.json()  # count, max_model_len and every token id


# -- errors ---------------------------------------------------------------------------------

LONG_TEXT = "hello " * (MAX_MODEL_LEN + 10)
ERRORS = {
    "unknown-model": ("/v1/chat/completions", {"model": "no-such-model", "messages": [{"role": "user", "content": "hi"}]}),
    "unknown-model-generate": ("/inference/v1/generate", {"model": "no-such-model", "token_ids": [1, 2],
                                                          "sampling_params": {"max_tokens": 2}}),
    "too-long-chat": ("/v1/chat/completions", {"model": SERVED_MODEL, "messages": [{"role": "user", "content": LONG_TEXT}],
                                               "max_tokens": 5}),
    "too-long-completions": ("/v1/completions", {"model": SERVED_MODEL, "prompt": [13] * (MAX_MODEL_LEN + 100),
                                                 "max_tokens": 5}),
    "too-long-generate": ("/inference/v1/generate", {"model": SERVED_MODEL, "token_ids": [13] * (MAX_MODEL_LEN + 1),
                                                     "sampling_params": {"max_tokens": 5}}),
    "full-window": ("/v1/completions", {"model": SERVED_MODEL, "prompt": [13] * MAX_MODEL_LEN, "max_tokens": 5}),
    "out-of-vocabulary": ("/v1/completions", {"model": SERVED_MODEL, "prompt": [999_999], "max_tokens": 1}),
    "messages-not-a-list": ("/v1/chat/completions", {"model": SERVED_MODEL, "messages": "not a list"}),
    "body-not-an-object": ("/v1/chat/completions", [1, 2]),
    "invalid-json": ("/v1/chat/completions", b"{not json"),
}
FIXED_MESSAGES = {"unknown-model", "unknown-model-generate", "too-long-chat", "too-long-completions", "too-long-generate",
                  "full-window", "out-of-vocabulary"}  # the rest are pydantic reports, alike only in kind and field


@pytest.mark.parametrize("case", list(ERRORS))
def test_error_shapes(double, real, case):
    path, body = ERRORS[case]
    mine, theirs = both(double, real, path, body)
    assert mine.status_code == theirs.status_code >= 400, (mine.text, theirs.text)
    assert_same_shape(mine.json(), theirs.json())
    ours, vllm = mine.json()["error"], theirs.json()["error"]
    assert (ours["type"], ours["param"], ours["code"]) == (vllm["type"], vllm["param"], vllm["code"])
    if case in FIXED_MESSAGES:
        assert ours["message"] == vllm["message"]


def messages_of_length(real, n_tokens: int) -> list[dict]:
    """One user message whose chat prompt is exactly `n_tokens` long (each repeated word is one token)."""
    def count(words: int) -> int:
        body = {"model": SERVED_MODEL, "messages": [{"role": "user", "content": "hello " * words}]}
        return real.post("/tokenize", json=body).json()["count"]

    words = 1000 + n_tokens - count(1000)
    assert count(words) == n_tokens
    return [{"role": "user", "content": "hello " * words}]


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions", "/inference/v1/generate"])
def test_max_tokens_past_the_window_is_clamped(double, real, path):
    """A prompt that fits but leaves less room than max_tokens is answered, cut at the window: no error."""
    room = 4
    ids = [13] * (MAX_MODEL_LEN - room)
    if path == "/v1/chat/completions":
        body = {"model": SERVED_MODEL, "messages": messages_of_length(real, MAX_MODEL_LEN - room), "max_tokens": 100}
    elif path == "/v1/completions":
        body = {"model": SERVED_MODEL, "prompt": ids, "max_tokens": 100}
    else:
        body = {"model": SERVED_MODEL, "token_ids": ids, "sampling_params": {"max_tokens": 100}}
    script(double, content="word " * 100)  # longer than the room, whichever endpoint
    mine, theirs = both(double, real, path, {**body, "return_token_ids": True})
    assert mine.status_code == theirs.status_code == 200, (mine.text, theirs.text)
    for response in (mine.json(), theirs.json()):
        choice = response["choices"][0]
        assert choice["finish_reason"] == "length" and len(choice["token_ids"]) == room
