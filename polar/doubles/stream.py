"""vLLM 0.32's server-sent event streams, chunk for chunk, for the scripted TEST DOUBLE.

A streamed answer is the *same sample* as the plain one (same token ids, logprobs, finish): only its
telling differs. Each builder walks the sampled ids one token at a time, as vLLM's engine hands them
to its serving layer, and yields a `Step` per token: the SSE events vLLM would send for it (none,
when vLLM sends nothing for that token). The shapes follow vLLM's generators field for field:
`chat_completion_stream_generator`, `completion_stream_generator` and, for /inference/v1/generate,
`serve_tokens_stream_generator`; tests/integration/test_double_vs_vllm.py compares them with the
real server's. Pacing, disconnects and mid-stream faults are sse.py's job.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from polar.doubles.deltas import DeltaParser


class ScriptedVLLM(Protocol):
    """What the answers are built from: the double's model (doubles/server.py), named here so that this module
    does not import the server that imports it."""

    tokenizer: Any
    model_name: str
    format: Any
    logprobs: Any
    fingerprint: Any
    eos_id: Any
    think_start_id: Any
    think_end_id: Any

DONE = "data: [DONE]\n\n"


@dataclass
class Sample:
    """One sampled answer: what both the plain and the streamed response tell."""

    prompt_ids: list[int]
    ids: list[int]
    finish: str  # "stop" | "length"
    stop_reason: str | None  # the stop string that cut it


@dataclass
class Step:
    """The events sent once `tokens` more tokens are sampled (0: framing, such as the usage chunk)."""

    tokens: int
    events: list[str]


def event(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False, separators=(',', ':'))}\n\n"


def usage_options(body: dict[str, Any]) -> tuple[bool, bool]:
    """(include_usage, continuous_usage_stats) as vLLM reads `stream_options`."""
    options = body.get("stream_options") or {}
    include = bool(options.get("include_usage"))
    return include, include and bool(options.get("continuous_usage_stats"))


def pieces(double: ScriptedVLLM, sample: Sample, stop: Any, skip_special_tokens: bool = True) -> Iterator[str]:
    """The text each token adds, as vLLM's detokenizer releases it: incomplete characters wait for their
    last byte, the stop token is never decoded, and with stop strings the last `len(longest) - 1`
    characters wait until the end (they might begin the stop string)."""
    from tokenizers.decoders import DecodeStream

    stream = DecodeStream(ids=sample.prompt_ids, skip_special_tokens=skip_special_tokens)
    stops = [stop] if isinstance(stop, str) else [s for s in stop or [] if s]
    hold = max((len(s) for s in stops), default=1) - 1
    text, released = "", 0
    for k, token in enumerate(sample.ids):
        last = k == len(sample.ids) - 1
        if not (last and token == double.eos_id and sample.finish == "stop" and sample.stop_reason is None):
            text += stream.step(double.tokenizer._tokenizer, token) or ""
        upto = len(text) if last else max(len(text) - hold, released)
        yield text[released:upto]
        released = upto


def reasoning_counts(double: ScriptedVLLM, prompt_ids: list[int], ids: list[int], thinking: bool,
                     streamed: bool = True) -> list[int]:
    """The reasoning-token count after each token, as vLLM's qwen3 parser keeps it: tokens before `</think>`,
    the tags and the stop token left out. A stream counts only tokens that added reasoning text (not a piece
    of an unfinished character); a plain answer counts them all (vLLM's two counts differ there too)."""
    from tokenizers.decoders import DecodeStream

    counts, count, ended = [], 0, not thinking
    stream = DecodeStream(ids=prompt_ids, skip_special_tokens=True)
    for token in ids:
        piece = stream.step(double.tokenizer._tokenizer, token) if streamed else "-"
        ended = ended or token == double.think_end_id
        count += not ended and bool(piece) and token not in (double.think_start_id, double.eos_id)
        counts.append(count)
    return counts


def chat(double: ScriptedVLLM, body: dict[str, Any], sample: Sample, prompt_text: str) -> Iterator[Step]:
    tools = body.get("tools") or []
    mode = double.format.reasoning_mode(prompt_text)
    parser = DeltaParser(double.format.family, mode, tools)
    include_usage, continuous = usage_options(body)
    with_ids, top = bool(body.get("return_token_ids")), body.get("top_logprobs") or 0
    head = {"id": f"chatcmpl-{secrets.token_hex(8)}", "object": "chat.completion.chunk", "created": int(time.time()),
            "model": double.model_name}
    n_prompt, ids = len(sample.prompt_ids), sample.ids

    counts = [0, *reasoning_counts(double, sample.prompt_ids, ids, mode != "none")]

    def usage(done: int) -> dict[str, Any]:
        return {"prompt_tokens": n_prompt, "total_tokens": n_prompt + done, "completion_tokens": done,
                "completion_tokens_details": {"reasoning_tokens": counts[done]}}

    first = {**head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                                  "finish_reason": None}]}
    if continuous:
        first["usage"] = usage(0)
    first |= {"prompt_token_ids": sample.prompt_ids if with_ids else None, "prompt_text": None}
    opening = [event(first)]
    for k, piece in enumerate(pieces(double, sample, body.get("stop"))):
        last = k == len(ids) - 1
        delta = parser.feed(piece, finished=last)
        logprobs = {"content": [double.logprobs.chat(ids[k], k, top)]} if body.get("logprobs") else None
        if delta is None and not last and logprobs is None and not with_ids:
            yield Step(1, opening)  # vLLM sends nothing for a token its parsers hold
            opening = []
            continue
        choice: dict[str, Any] = {"index": 0, "delta": delta or {}, "logprobs": logprobs, "finish_reason": None}
        if last:
            finish = "tool_calls" if parser.tools_streamed and sample.finish == "stop" else sample.finish
            choice |= {"finish_reason": finish, "stop_reason": sample.stop_reason}
        choice["token_ids"] = [ids[k]] if with_ids else None
        chunk = {**head, "choices": [choice]}
        if continuous:
            chunk["usage"] = usage(k + 1)
        if last and not include_usage:
            chunk["system_fingerprint"] = double.fingerprint
        yield Step(1, [*opening, event(chunk)])
        opening = []
    if include_usage:
        yield Step(0, [event({**head, "choices": [], "usage": usage(len(ids)), "system_fingerprint": double.fingerprint})])
    yield Step(0, [DONE])


def completions(double: ScriptedVLLM, body: dict[str, Any], sample: Sample) -> Iterator[Step]:
    include_usage, continuous = usage_options(body)
    with_ids = bool(body.get("return_token_ids"))
    head = {"id": f"cmpl-{secrets.token_hex(8)}", "object": "text_completion", "created": int(time.time()),
            "model": double.model_name}
    ids, n_prompt = sample.ids, len(sample.prompt_ids)
    legacy = double.logprobs.legacy(ids, int(body["logprobs"])) if body.get("logprobs") is not None else None
    texts = pieces(double, sample, body.get("stop"), bool(body.get("skip_special_tokens", True)))
    for k, piece in enumerate(texts):
        last = k == len(ids) - 1
        logprobs = {key: values[k:k + 1] for key, values in legacy.items()} if legacy else None
        choice = {"index": 0, "text": piece, "logprobs": logprobs, "finish_reason": sample.finish if last else None,
                  "stop_reason": sample.stop_reason if last else None,
                  "prompt_token_ids": sample.prompt_ids if with_ids and k == 0 else None,
                  "token_ids": [ids[k]] if with_ids else None}
        chunk: dict[str, Any] = {**head, "choices": [choice]}
        if continuous:
            chunk["usage"] = {"prompt_tokens": n_prompt, "total_tokens": n_prompt + k + 1, "completion_tokens": k + 1}
        if last and not include_usage:
            chunk["system_fingerprint"] = double.fingerprint
        yield Step(1, [event(chunk)])
    if include_usage:
        usage = {"prompt_tokens": n_prompt, "total_tokens": n_prompt + len(ids), "completion_tokens": len(ids)}
        yield Step(0, [event({**head, "choices": [], "usage": usage, "system_fingerprint": double.fingerprint})])
    yield Step(0, [DONE])


def generate(double: ScriptedVLLM, body: dict[str, Any], sample: Sample) -> Iterator[Step]:
    params = body["sampling_params"]
    include_usage, continuous = usage_options(body)
    rid, mode = f"generate-tokens-{secrets.token_hex(8)}", body.get("output_mode") or "tokens"
    ids, n_prompt = sample.ids, len(sample.prompt_ids)
    top = params.get("logprobs")
    for k, token in enumerate(ids):
        last = k == len(ids) - 1
        choice = {"index": 0, "finish_reason": sample.finish if last else None,
                  "stop_reason": sample.stop_reason if last else None, "token_ids": [token], "routed_experts": None,
                  "sampling_mask": None,
                  "weight_versions": [{"version": "default", "start": 0, "end": len(ids)}] if last else None,
                  "logprobs": None if top is None else {"content": [double.logprobs.by_id(token, k, int(top))]}}
        chunk: dict[str, Any] = {"request_id": rid, "usage": None}
        if continuous:
            chunk["usage"] = {"prompt_tokens": n_prompt, "total_tokens": n_prompt + k + 1, "completion_tokens": k + 1,
                              "prompt_tokens_details": None, "completion_tokens_details": None}
        if k == 0 and body.get("return_token_ids"):
            chunk["prompt_token_ids"] = sample.prompt_ids  # the first chunk only
        yield Step(1, [event(chunk | {"output_mode": mode, "choices": [choice]})])
    if include_usage:
        usage = {"prompt_tokens": n_prompt, "total_tokens": n_prompt + len(ids), "completion_tokens": len(ids)}
        yield Step(0, [event({"request_id": rid, "usage": usage, "output_mode": mode, "choices": []})])
    yield Step(0, [DONE])
