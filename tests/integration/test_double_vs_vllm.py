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
    return a if a == b else "|".join(sorted(set(str(a).split("|")) | set(str(b).split("|"))))


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
    "stream-options-without-stream": ("/v1/chat/completions", {"model": SERVED_MODEL, "messages": [
        {"role": "user", "content": "hi"}], "stream_options": {"include_usage": True}}),
    "stream-options-without-stream-completions": ("/v1/completions", {"model": SERVED_MODEL, "prompt": [13],
                                                                      "stream_options": {"include_usage": True}}),
}
FIXED_MESSAGES = {"unknown-model", "unknown-model-generate", "too-long-chat", "too-long-completions", "too-long-generate",
                  "full-window", "out-of-vocabulary", "stream-options-without-stream",
                  "stream-options-without-stream-completions"}  # the rest are pydantic reports, alike only in kind and field


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


# -- streams ----------------------------------------------------------------------------------
# A stream's chunks differ by position: the first (chat: the role chunk; otherwise the first token's, with
# the prompt ids), the middle ones (one per token, or per batch of tokens: vLLM merges a few into one chunk
# when its loop lags behind the engine), the final one (the finish), the usage chunk (`choices: []`) and
# [DONE]. Per class, the chunks' merged JSON structure must be vLLM's. Which deltas (reasoning, content,
# tool-call pieces) come is compared over the middle and final chunks together, since a lagging vLLM may
# put the last few tokens' deltas into its final chunk.


def sse(client: httpx.Client, path: str, body: dict) -> list[dict | None]:
    """The events of one stream: each chunk's JSON, None for [DONE]."""
    events = []
    with client.stream("POST", path, json={**body, "stream": True}) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"] == "text/event-stream; charset=utf-8"
        for line in response.iter_lines():
            if line:
                assert line.startswith("data: "), line
                events.append(None if line == "data: [DONE]" else json.loads(line[6:]))
    return events


def _without_delta(chunk: dict) -> dict:
    return {**chunk, "choices": [{k: v for k, v in c.items() if k != "delta"} for c in chunk["choices"]]}


def classes(events: list[dict | None], role_first: bool) -> dict[str, object]:
    """Each position class's merged skeleton (deltas apart, in "deltas")."""
    assert events[-1] is None and events.count(None) == 1, "one [DONE], last"
    chunks = events[:-1]
    usage = [c for c in chunks if not c["choices"]]
    tokens = [c for c in chunks if c["choices"]]
    assert usage == chunks[len(tokens):], "the usage chunk comes after the token chunks"
    finals = [n for n, c in enumerate(tokens) if c["choices"][0]["finish_reason"] is not None]
    assert finals == [len(tokens) - 1], "the finish comes on the last token chunk only"
    first, middle, final = tokens[0], tokens[1:-1], tokens[-1]
    out = {"first": skeleton(first), "final": skeleton(_without_delta(final)), "usage": [skeleton(c) for c in usage],
           "middle": functools.reduce(merge, [skeleton(_without_delta(c)) for c in middle]) if middle else None}
    if role_first:
        out["deltas"] = functools.reduce(merge, [skeleton(c["choices"][0]["delta"]) for c in tokens[1:]])
    return out


def assert_same_stream_shape(mine: list[dict | None], theirs: list[dict | None], role_first: bool = False,
                             deltas: bool = True) -> None:
    ours, vllms = classes(mine, role_first), classes(theirs, role_first)
    if vllms["middle"] is None:  # vLLM lagged and sent every token at once: nothing to compare there
        ours["middle"] = None
    if not deltas:
        ours.pop("deltas", None)
        vllms.pop("deltas", None)
    diff = [f"{name}: {d}" for name in ours for d in differences(ours[name], vllms[name], name)]
    assert not diff, "\n".join(sorted(diff))


def assembled(events: list[dict | None]) -> dict:
    """A chat stream put back together: reasoning, content, calls, ids, logprobs, finish."""
    out = {"reasoning": "", "content": "", "calls": [], "ids": [], "logprobs": [], "finish": None}
    for chunk in filter(None, events):
        for choice in chunk["choices"]:
            delta = choice["delta"]
            out["reasoning"] += delta.get("reasoning") or ""
            out["content"] += delta.get("content") or ""
            for call in delta.get("tool_calls", []):
                if "id" in call:
                    out["calls"].append({"name": call["function"]["name"], "arguments": ""})
                out["calls"][call["index"]]["arguments"] += call["function"].get("arguments") or ""
            out["ids"] += choice.get("token_ids") or []
            out["logprobs"] += (choice.get("logprobs") or {}).get("content") or []
            out["finish"] = choice["finish_reason"] or out["finish"]
    return out


CHAT_STREAMS = {
    "token-ids": {"return_token_ids": True, "logprobs": True, "top_logprobs": 2, "stream_options": {"include_usage": True}},
    "usage": {"stream_options": {"include_usage": True, "continuous_usage_stats": True}},
    "bare": {"chat_template_kwargs": {"enable_thinking": False}},
}


@pytest.mark.parametrize("variant", list(CHAT_STREAMS))
def test_chat_stream_shape(double, real, variant):
    body = {"model": SERVED_MODEL, "messages": CONVERSATION[-1:], "max_tokens": 8, "temperature": 0,
            **CHAT_STREAMS[variant]}
    plain = real.post("/v1/chat/completions", json={**body, "return_token_ids": True, "stream_options": None}).json()
    script(double, **mimic(plain["choices"][0]["message"]))
    mine, theirs = sse(double, "/v1/chat/completions", body), sse(real, "/v1/chat/completions", body)
    assert_same_stream_shape(mine, theirs, role_first=True)
    assert mine[0]["prompt_token_ids"] == theirs[0]["prompt_token_ids"]
    assert mine[0]["choices"][0]["delta"] == theirs[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    if variant == "token-ids":
        assert theirs[0]["prompt_token_ids"] == plain["prompt_token_ids"]
        assert assembled(theirs)["ids"] == plain["choices"][0]["token_ids"]


def spelled_as_tags(tokenizer, events: list[dict | None], calls: int) -> bool:
    """Whether vLLM's forced answer opened each call with the `<tool_call>` token, as a model does. Under a
    regex the random model may spell it out of plain text tokens instead, which vLLM's XML engine reads as
    content: the deltas then differ from any real model's, and only the calls are compared."""
    ids = assembled(events)["ids"]
    return ids.count(tokenizer.convert_tokens_to_ids("<tool_call>")) == calls


@pytest.mark.parametrize("answer", list(ANSWERS))
def test_chat_stream_of_tool_calls(double, real, tokenizer, answer):
    """vLLM made to write a given answer with calls, streamed through its tool parser; the double scripted alike."""
    from polar.doubles.scripted_vllm import Step, render_completion

    content, calls = ANSWERS[answer]
    text = render_completion(Step(content=content, tool_calls=calls), thinking=False)
    body = {"model": SERVED_MODEL, "messages": CONVERSATION[:2], "tools": TOOLS, "max_tokens": 200, "temperature": 0,
            "chat_template_kwargs": {"enable_thinking": False}, "stream_options": {"include_usage": True}, **TOKEN_BODY}
    theirs = sse(real, "/v1/chat/completions", {**body, "structured_outputs": {"regex": re.escape(text)}})
    script(double, content=content, tool_calls=calls)
    mine = sse(double, "/v1/chat/completions", body)
    canonical = spelled_as_tags(tokenizer, theirs, len(calls))
    assert_same_stream_shape(mine, theirs, role_first=True, deltas=canonical)
    ours, vllm = assembled(mine), assembled(theirs)
    assert ours["calls"] == vllm["calls"] and len(vllm["calls"]) == len(calls)  # arguments JSON byte for byte
    if canonical:
        assert ours["content"] == vllm["content"]  # the blank lines before a call included, as vLLM streams them
    assert ours["finish"] == vllm["finish"] == "tool_calls"
    # tool-call deltas ride on chunks that carry their token's id and logprob
    with_calls = [c["choices"][0] for c in theirs[1:] if c and c["choices"] and c["choices"][0]["delta"].get("tool_calls")]
    assert with_calls and all(len(c["token_ids"]) >= 1 and c["logprobs"]["content"] for c in with_calls)


def test_generate_without_max_tokens_is_not_cut_at_16(double, real, prompt_ids):
    """vLLM 0.32's generate endpoint gives the rest of the window when max_tokens is not set, not 16."""
    script(double, content=" ".join(f"word{i}" for i in range(30)))
    body = {"model": SERVED_MODEL, "token_ids": prompt_ids, "sampling_params": {"temperature": 0}}
    mine, theirs = both(double, real, "/inference/v1/generate", body)
    for response in (mine.json(), theirs.json()):
        assert len(response["choices"][0]["token_ids"]) > 16, response["choices"][0]["finish_reason"]


def _legacy_stream(events: list[dict | None]) -> list[dict | None]:
    return [e if e is None or not e["choices"] else {**e, "choices": [_legacy_keys(c) for c in e["choices"]]}
            for e in events]


def test_completions_stream_shape(double, real, prompt_ids):
    body = {"model": SERVED_MODEL, "prompt": prompt_ids, "max_tokens": 6, "temperature": 0, "logprobs": 0,
            "return_token_ids": True, "stream_options": {"include_usage": True}}
    mine, theirs = sse(double, "/v1/completions", body), sse(real, "/v1/completions", body)
    assert_same_stream_shape(_legacy_stream(mine), _legacy_stream(theirs))
    for events in (mine, theirs):
        choices = [e["choices"][0] for e in events[:-1] if e["choices"]]
        assert [c["prompt_token_ids"] for c in choices] == [prompt_ids] + [None] * (len(choices) - 1)
        assert sum(len(c["token_ids"]) for c in choices) == 6


def test_generate_stream_shape(double, real, prompt_ids):
    body = {"model": SERVED_MODEL, "token_ids": prompt_ids, "output_mode": "tokens", "return_token_ids": True,
            "sampling_params": {"max_tokens": 6, "temperature": 0, "logprobs": 0}, "stream_options": {"include_usage": True}}
    mine, theirs = sse(double, "/inference/v1/generate", body), sse(real, "/inference/v1/generate", body)
    assert_same_stream_shape(mine, theirs)
    for events in (mine, theirs):
        tokens = [e for e in events[:-1] if e["choices"]]
        assert tokens[0]["prompt_token_ids"] == prompt_ids and all("prompt_token_ids" not in e for e in tokens[1:])
        assert tokens[-1]["choices"][0]["weight_versions"] == [{"version": "default", "start": 0, "end": 6}]
        assert all(e["choices"][0]["weight_versions"] is None for e in tokens[:-1])


def _max_logprob_gap(streamed: list[float], plain: list[float]) -> float:
    assert len(streamed) == len(plain)
    return max(abs(a - b) for a, b in zip(streamed, plain, strict=True))


@pytest.mark.parametrize("endpoint", ["chat", "generate"])
def test_real_vllm_streams_the_plain_sample(real, prompt_ids, endpoint):
    """A fact the double relies on: a greedy request streamed gives vLLM's plain answer, token for token."""
    n = 32
    if endpoint == "chat":
        path = "/v1/chat/completions"
        body = {"model": SERVED_MODEL, "messages": CONVERSATION, "tools": TOOLS, "max_tokens": n, "temperature": 0,
                **TOKEN_BODY}
        plain = real.post(path, json=body).json()["choices"][0]
        streamed = assembled(sse(real, path, body))
        ids, lps = streamed["ids"], [e["logprob"] for e in streamed["logprobs"]]
        plain_ids, plain_lps = plain["token_ids"], [e["logprob"] for e in plain["logprobs"]["content"]]
        finish = streamed["finish"]
    else:
        path = "/inference/v1/generate"
        body = {"model": SERVED_MODEL, "token_ids": prompt_ids, "return_token_ids": True,
                "sampling_params": {"max_tokens": n, "temperature": 0, "logprobs": 0}}
        plain = real.post(path, json=body).json()["choices"][0]
        choices = [e["choices"][0] for e in sse(real, path, body)[:-1] if e["choices"]]
        ids = sum((c["token_ids"] for c in choices), [])
        lps = [e["logprob"] for c in choices for e in c["logprobs"]["content"]]
        plain_ids, plain_lps = plain["token_ids"], [e["logprob"] for e in plain["logprobs"]["content"]]
        finish = choices[-1]["finish_reason"]
    gap = _max_logprob_gap(lps, plain_lps)
    print(f"{endpoint}: {len(ids)} tokens streamed = plain: {ids == plain_ids}; max |Δ logprob| {gap:.3g}")
    assert ids == plain_ids and len(ids) == n
    assert finish == plain["finish_reason"]
    assert gap <= 1e-2


@pytest.mark.parametrize("answer", ["text-and-call", "parallel"])
def test_chat_stream_of_tool_calls_on_real_templates(double, tokenizer, template_vllm, answer):
    """Each real template's tool parser streamed (hermes for Qwen3's JSON calls, qwen3_coder for the XML
    format): vLLM made to write the template family's answer, the double switched to that template."""
    from polar.doubles.model_format import THINK_CLOSE, ModelFormat
    from polar.doubles.scripted_vllm import Step

    content, calls = ANSWERS[answer]
    text = ModelFormat.for_template(template_vllm.template.read_text()).completion(
        Step(content=content, tool_calls=calls), THINK_CLOSE)  # thinking off: no reasoning block
    body = {"model": SERVED_MODEL, "messages": CONVERSATION[:2], "tools": TOOLS, "max_tokens": 200, "temperature": 0,
            "chat_template_kwargs": {"enable_thinking": False}, **TOKEN_BODY}
    with httpx.Client(base_url=template_vllm.url, timeout=300) as real:
        theirs = sse(real, "/v1/chat/completions", {**body, "structured_outputs": {"regex": re.escape(text)}})
    double.post("/_double/template", json={"chat_template": str(template_vllm.template)}).raise_for_status()
    try:
        script(double, content=content, tool_calls=calls)
        mine = sse(double, "/v1/chat/completions", body)
    finally:
        double.post("/_double/template", json={"chat_template": None}).raise_for_status()
    canonical = spelled_as_tags(tokenizer, theirs, len(calls))
    assert_same_stream_shape(mine, theirs, role_first=True, deltas=canonical)
    assert mine[0]["prompt_token_ids"] == theirs[0]["prompt_token_ids"]
    ours, vllm = assembled(mine), assembled(theirs)
    assert ours["calls"] == vllm["calls"] and len(vllm["calls"]) == len(calls)
    assert ours["finish"] == vllm["finish"] == "tool_calls"
    if canonical:
        assert ours["content"] == vllm["content"]
