"""What vLLM answered, as a ChatResult: shared by the whole answers and the streams of every endpoint."""

from __future__ import annotations

from typing import Any

import numpy as np

from polar.canonical import ChatRequest, ChatResult, Reasoning, ToolCall, Usage
from polar.capture.tokens import as_ids
from polar.errors import GatewayError


def chat_result(
    call_id: str, request: ChatRequest, *, model: str, created: int, content: str, reasoning: str | None,
    tool_calls: list[ToolCall], finish: str | None, stop_reason: Any, usage: dict, prompt_ids: list[int] | np.ndarray,
    completion_ids: list[int], logprobs: list,
) -> ChatResult:
    """What vLLM's chat endpoint answered (whole or accumulated from its stream), as a ChatResult.

    Template glue is not answer text, as polar's own parse (tokens/parsers.py) and the templates' re-rendering
    have it: the newlines around the reasoning (an empty `<think>\n</think>` is no reasoning), those after
    `</think>` and the whitespace touching a tool call. vLLM 0.32 keeps some of it, and not the same in its
    stream and its whole answer; ChatStream applies the same rule as it streams."""
    finish = finish or "stop"
    content = content_as_written(content, reasoning is not None, bool(tool_calls))
    reasoning = reasoning.strip("\n") if reasoning is not None else None
    stop_sequence = stop_reason if isinstance(stop_reason, str) and stop_reason in request.sampling.stop else None
    if tool_calls and finish != "length":
        finish = "tool_calls"
    elif stop_sequence is not None:
        finish = "stop_sequence"
    elif finish not in ("stop", "length", "tool_calls", "content_filter"):
        finish = "stop"
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    return ChatResult(
        id=call_id,
        model=model,
        created=created,
        content=content,
        reasoning=Reasoning(text=reasoning) if reasoning and reasoning.strip() else None,
        tool_calls=tool_calls,
        finish_reason=finish,
        stop_sequence=stop_sequence,
        usage=Usage(
            prompt_tokens=usage.get("prompt_tokens", len(prompt_ids)),
            completion_tokens=usage.get("completion_tokens", len(completion_ids)),
            cached_tokens=cached,
        ),
        prompt_token_ids=prompt_ids,
        completion_token_ids=completion_ids,
        completion_logprobs=logprobs_or_none(logprobs, len(completion_ids)),
    )


def token_array(ids: Any, what: str) -> np.ndarray:
    """Token ids from an upstream's JSON as the uint32 array every later step uses, converted once. A chat-mode
    answer carries the whole prompt's ids (100k+ at agent size): as a list, ChatResult would validate them one
    by one and the gateway convert them again, a cost growing with the context."""
    try:
        return as_ids([] if ids is None else ids)
    except (TypeError, OverflowError, ValueError) as exc:
        raise GatewayError("upstream_error", f"the upstream's {what} are not token ids ({exc})") from None


def logprobs_or_none(values: list, n_tokens: int) -> list[float] | None:
    """The sampled tokens' logprobs, or None when the upstream did not give one for every token:
    a trainer must see that they are missing, never a made-up 0.0 (probability one)."""
    if len(values) != n_tokens or any(not isinstance(v, (int, float)) for v in values):
        return None
    return [float(v) for v in values]


def content_as_written(content: str, after_think: bool, before_calls: bool) -> str:
    """The answer text without the template's glue (see chat_result)."""
    if after_think:
        content = content.lstrip("\n")
    return content.rstrip() if before_calls else content


def weight_version(choice: dict[str, Any]) -> str | None:
    """vLLM's label for the weights that sampled a token-in choice (its last span's; "default" until a trainer
    names one). A label, not the trainer's step: the gate stamps that (gateway/gate.py)."""
    versions = choice.get("weight_versions") or []
    version = versions[-1].get("version") if versions else None
    return None if version is None else str(version)
