"""Against the real vLLM: each captured row's token ids are exactly what vLLM returned, for all four APIs.

A recording tap sits between polar and vLLM, so every capture row is held against the very answer
vLLM gave for that call. polar runs in both prompt modes: chat-template (vLLM renders the prompt;
the row must hold its `prompt_token_ids`, `token_ids` and logprobs) and token-faithful (polar sends
token ids to /inference/v1/generate; the row must hold the prompt polar sent and the ids vLLM
sampled). Each official SDK, streamed and not, thinking on and off, must parse the answer and see
the text, reasoning, finish reason and token usage that match the capture.
"""

from __future__ import annotations

import uuid

import pytest

from tests.support.tap import Exchange

pytestmark = pytest.mark.vllm

PROVIDERS = ["anthropic", "openai_chat", "openai_responses", "gemini"]
MODES = ["chat-template", "token-faithful"]
MAX_TOKENS = 32
EOS = 248046  # <|im_end|>
QUESTION = "What does this repository do? Réponds en français — 简短 ✓"


@pytest.fixture(scope="module")
def polars(tap, start_polar):
    """polar in both prompt modes, each in front of the tap."""
    return {mode: start_polar(tap.url, mode) for mode in MODES}


def one_call(tap, polar, converse, provider: str, stream: bool, thinking: bool, max_tokens: int = MAX_TOKENS):
    """One SDK call through polar → (the SDK's answer, the capture row, the upstream exchange it made)."""
    session = f"gw-{provider}-{uuid.uuid4().hex[:8]}"
    tap.clear()
    (answer,) = converse(provider, polar.url, session, [(QUESTION, max_tokens)], stream=stream, thinking=thinking)
    (row,) = polar.rows(session)
    assert row["status"] == "ok", (row["error_kind"], row["error"])
    (call,) = tap.model_calls()
    return answer, row, call


def vllm_tokens(call: Exchange) -> tuple[list[int], list[int], list[float]]:
    """(prompt ids, sampled ids, logprobs) as vLLM reported them, whichever endpoint polar called."""
    choice = call.response["choices"][0]
    if call.path == "/v1/completions":  # prompt ids on the choice, logprobs in the legacy layout
        return choice["prompt_token_ids"], choice["token_ids"], choice["logprobs"]["token_logprobs"]
    if call.path == "/inference/v1/generate":
        # polar does not ask vLLM to echo the prompt it built (100k+ ids at agent size): the ids on the wire
        # are the prompt (vLLM samples from them unchanged: test_real_vllm's generate test).
        assert call.response.get("prompt_token_ids") is None
        prompt = call.request["token_ids"]
    else:
        prompt = call.response["prompt_token_ids"]
    logprobs = [entry["logprob"] for entry in choice["logprobs"]["content"]]
    return prompt, choice["token_ids"], logprobs


@pytest.mark.parametrize("thinking", [False, True], ids=["no-thinking", "thinking"])
@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("mode", MODES)
def test_capture_holds_exactly_what_vllm_returned(tap, polars, converse, mode, provider, stream, thinking):
    polar = polars[mode]
    answer, row, call = one_call(tap, polar, converse, provider, stream, thinking)
    prompt_ids, sampled_ids, logprobs = vllm_tokens(call)

    assert row["prompt_ids"] == prompt_ids and row["prompt_len"] == len(prompt_ids)
    assert row["completion_ids"] == sampled_ids and row["completion_len"] == len(sampled_ids)
    assert row["completion_logprobs"] == pytest.approx(logprobs, abs=1e-6)
    assert 0 < len(sampled_ids) <= MAX_TOKENS

    if mode == "chat-template":
        assert call.path == "/v1/chat/completions"
        assert call.request["return_token_ids"] is True and call.request["logprobs"] is True
        message = call.response["choices"][0]["message"]
        # The client sees vLLM's own parse of the sample, untouched.
        shown = (message["content"] or "", message["reasoning"] or "")
        assert call.request["chat_template_kwargs"] == {"enable_thinking": thinking}
    else:
        assert call.path == "/inference/v1/generate", "vLLM serves the token endpoint: polar must use it"
        assert call.request["token_ids"] == row["prompt_ids"]  # the prompt polar built is the one vLLM saw
        assert row["prompt_mode"].startswith("re-render")  # a first call has no earlier turn to extend
        result = row["result"]
        shown = (result.get("content") or "", (result.get("reasoning") or {}).get("text") or "")
    assert (answer.text, answer.reasoning) == shown
    if not thinking:
        assert answer.reasoning == ""
    assert answer.finish == row["finish_reason"]
    assert answer.finish == ("stop" if sampled_ids[-1] == EOS else "length")
    assert (answer.input_tokens, answer.output_tokens) == (row["prompt_len"], row["completion_len"])


@pytest.mark.parametrize("thinking", [False, True], ids=["no-thinking", "thinking"])
@pytest.mark.parametrize("provider", PROVIDERS)
def test_polar_renders_the_first_prompt_as_vllm_does(tap, polars, converse, provider, thinking):
    """The same SDK request in both modes: polar's own template rendering equals vLLM's, id for id."""
    prompts = {}
    for mode, polar in polars.items():
        _, row, _ = one_call(tap, polar, converse, provider, False, thinking, max_tokens=1)
        prompts[mode] = row["prompt_ids"]
    assert prompts["token-faithful"] == prompts["chat-template"]


def test_count_tokens_matches_the_prompt_vllm_builds(tap, polars):
    """Anthropic count_tokens in chat-template mode: vLLM counts the same prompt its chat endpoint will build."""
    import anthropic

    polar = polars["chat-template"]
    session = f"count-{uuid.uuid4().hex[:8]}"
    client = anthropic.Anthropic(base_url=polar.url, api_key="sk-ant-test", max_retries=0,
                                 default_headers={"x-polar-session": session})
    kwargs = dict(model="claude-sonnet-4-5", thinking={"type": "adaptive"})
    first = client.messages.create(messages=[{"role": "user", "content": QUESTION}], max_tokens=16, **kwargs)
    assert first.content[0].type == "thinking" and first.content[0].thinking  # the history carries reasoning
    history = [{"role": "user", "content": QUESTION},
               {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
               {"role": "user", "content": "And then?"}]
    counted = client.messages.count_tokens(messages=history, **kwargs).input_tokens
    client.messages.create(messages=history, max_tokens=1, **kwargs)
    prompt_len = polar.rows(session)[-1]["prompt_len"]
    assert counted == prompt_len
