"""Token-in, token-out turns against vLLM: polar builds the prompt ids, vLLM only samples.

When a request extends an earlier turn of its session, the prompt is that turn's prompt ids +
its sampled ids + the template's rendering of only the new messages, so no sampled token is
ever re-encoded. Otherwise the whole conversation is rendered with the model's chat template
and the capture records why the prefix could not be kept. The sampled ids are decoded and
parsed here (reasoning, content, tool calls) by the template's model family parser (ChatTemplate.parse).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from polar.canonical import ChatRequest, ChatResult, Reasoning, Usage, holds_image
from polar.errors import GatewayError
from polar.sessions.splice import KEPT, SPLICED, splice
from polar.sessions.state import REPEATED, Extension, SessionView
from polar.tokens.harmony_turns import HISTORY_RULE, apply_history_rule
from polar.tokens.messages import to_openai_messages
from polar.tokens.parsers import ParsedTurn
from polar.tokens.shaping import TemplateTraits
from polar.tokens.template import ChatTemplate, openai_tools
from polar.upstream.base import UpstreamStream
from polar.upstream.http import StreamRequest
from polar.upstream.results import logprobs_or_none, weight_version
from polar.upstream.token_stream import TokenStream
from polar.upstream.vllm_chat import VLLMChat

log = logging.getLogger("polar.tokens")

GENERATE, COMPLETIONS = "/inference/v1/generate", "/v1/completions"


class TokenFaithful:
    """A gateway backend: token-faithful prompts, token-id calls to vLLM, local output parsing."""

    def __init__(self, chat: VLLMChat, template: ChatTemplate, endpoint: str = "auto"):
        self.chat = chat  # model name, /tokenize, the HTTP client, and the image fallback
        self.template = template
        self.endpoint = endpoint  # auto | generate | completions
        self._max_model_len: int | None = None

    async def model(self) -> str:
        return await self.chat.model()

    def template_traits(self) -> TemplateTraits:
        return self.template.traits()

    async def aclose(self) -> None:
        await self.chat.aclose()

    async def count_tokens(self, request: ChatRequest) -> int:
        return len(await asyncio.to_thread(self._render_all, request))

    async def complete(self, request: ChatRequest, call_id: str, session: SessionView | None = None) -> ChatResult:
        if _has_images(request):
            result = await self.chat.complete(request, call_id)  # vLLM's own multimodal processing
            result.prompt_mode = "chat-template (images)"
            return result
        prompt_ids, mode = await self._prompt(request, session)
        path, body = await self._sampling_request(prompt_ids, request, stream=False)
        data = await self.chat.http.call("POST", path, body)
        sampled, logprobs, finish, stop_reason, version = (_from_generate if path == GENERATE else _from_completions)(data)
        result = self.result(request, call_id, prompt_ids, sampled, logprobs, finish, stop_reason, version)
        result.prompt_mode = mode
        return result

    async def stream(self, request: ChatRequest, call_id: str, session: SessionView | None = None) -> UpstreamStream:
        if _has_images(request):
            return _Labelled(await self.chat.stream(request, call_id), "chat-template (images)")
        prompt_ids, mode = await self._prompt(request, session)
        path, body = await self._sampling_request(prompt_ids, request, stream=True)
        return TokenStream(StreamRequest(self.chat.http, path, body), self, request, call_id, prompt_ids, mode)

    async def _prompt(self, request: ChatRequest, session: SessionView | None) -> tuple[Sequence[int], str]:
        """The prompt ids (a list, or an array when extended): the session's turn extended by the new messages, else the whole conversation
        rendered (and why)."""
        extension, reason = session.extension(request) if session else (None, "no session state")
        if extension is None and session is not None and (same := session.repeat(request)):
            return np.concatenate(same.ids.head(same.prompt_len)), f"token-faithful ({REPEATED} {same.row})"
        spliced = ""
        if extension is None and session is not None and (found := session.reappearance(request)):
            if session.keep_dropped:  # the turn extended whole: what the harness dropped stays in the model's view
                extension, spliced = Extension(found.turn, found.new_messages), f" ({KEPT})"
            else:  # a turn the harness moved messages around (renders the kept history: off the event loop)
                extension, why = await asyncio.to_thread(splice, found, request, self.template)
                reason, spliced = (f"{reason}; {why}", "") if extension is None else (reason, f" ({SPLICED})")
        if extension is not None:
            prompt_ids, mode = self._extend(extension, request)
            if prompt_ids is not None:
                return prompt_ids, mode + spliced
            reason = mode
        return await asyncio.to_thread(self._render_all, request), f"re-render: {reason}"

    # -- prompt construction ---------------------------------------------------------------

    def _tools(self, request: ChatRequest) -> list[dict[str, Any]] | None:
        return openai_tools(request.tools) or None  # each made once (tool_json.py)

    def _render_all(self, request: ChatRequest) -> list[int]:
        messages = [m for msg in request.messages for m in to_openai_messages(msg)]
        return self.template.prompt_ids(messages, self._tools(request), request.thinking.enabled)

    def _extend(self, ext: Extension, request: ChatRequest) -> tuple[np.ndarray | None, str]:
        new = [m for msg in ext.new_messages for m in to_openai_messages(msg)]
        sampled_any = len(ext.turn.ids) > ext.turn.prompt_len
        ended_with_eos = sampled_any and ext.turn.ids.last() == self.template.end_of_turn_id
        answer = request.messages[len(request.messages) - len(ext.new_messages) - 1]
        cont = self.template.continuation(
            new, self._tools(request), request.thinking.enabled, previous_ended_with_eos=bool(ended_with_eos),
            last_id=int(ext.turn.ids.last()) if sampled_any else None,
            previous_calls=[call.name for call in answer.tool_calls or []],
        )
        if cont.failure:
            return None, f"template cannot render the new messages alone: {cont.failure}"
        mode = "token-faithful" + (" (closed a truncated turn)" if cont.closed_truncated_turn else "")
        if cont.history_rule:  # a new trajectory segment: the earlier ids as the template's history writes them
            earlier = apply_history_rule(ext.turn.ids.array(), self.template.tokenizer)
            if earlier is None:
                return None, "the sampled turn does not end as the template's history rule expects"
            return np.concatenate([earlier, np.asarray(cont.ids, dtype=earlier.dtype)]), f"token-faithful ({HISTORY_RULE})"
        # An array: the earlier turn's ids are never made Python ints (they go upstream through orjson).
        return ext.turn.ids.extended(cont.ids), mode

    # -- sampling ----------------------------------------------------------------------------

    async def context_length(self) -> int | None:
        return await self.chat.context_length()

    async def _limit(self) -> int:
        if self._max_model_len is None:
            self._max_model_len = await self.chat.context_length() or 32768
        return self._max_model_len

    async def _sampling_request(self, prompt_ids: Sequence[int], request: ChatRequest, stream: bool) -> tuple[str, dict]:
        """The token-in call for these prompt ids: its path and body."""
        s = request.sampling
        window = await self._limit()
        room = window - len(prompt_ids)
        if room <= 0:
            raise GatewayError(
                "context_length",
                f"the prompt is {len(prompt_ids)} tokens; the model's maximum context length is {window} tokens",
            )
        params: dict[str, Any] = {"max_tokens": min(s.max_tokens or room, room)}
        for key in ("temperature", "top_p", "top_k", "seed", "presence_penalty", "frequency_penalty"):
            if getattr(s, key) is not None:
                params[key] = getattr(s, key)
        if s.stop:
            params["stop"] = s.stop
        if self.endpoint == "auto":
            self.endpoint = await self._probe_generate()
        streaming = {"stream": True, "stream_options": {"include_usage": True}} if stream else {}
        if self.endpoint == "generate":
            # No return_token_ids: the sampled ids come anyway; it would only echo the prompt polar built.
            return GENERATE, {"model": await self.model(), "token_ids": prompt_ids,
                              "sampling_params": {**params, "logprobs": 0}, "output_mode": "tokens", **streaming}
        return COMPLETIONS, {"model": await self.model(), "prompt": prompt_ids, **params, "logprobs": 0,
                             "return_token_ids": True, "skip_special_tokens": False, **streaming}

    async def _probe_generate(self) -> str:
        """vLLM offers /inference/v1/generate only when started with --enable-scale-out."""
        status = await self.chat.http.status("POST", GENERATE, {})
        endpoint = "generate" if status is not None and status not in (404, 405) else "completions"
        log.info("token-in calls go to %s", GENERATE if endpoint == "generate" else COMPLETIONS)
        return endpoint

    def result(self, request, call_id, prompt_ids, sampled, logprobs, finish, stop_reason, version,
               parsed: ParsedTurn | None = None) -> ChatResult:
        """A sampled turn, decoded and parsed by the template's model family. A stream hands over the parse it
        made as the ids came (`parsed`: the same turn, with the call ids its client was sent)."""
        stop_sequence = stop_reason if isinstance(stop_reason, str) and stop_reason in request.sampling.stop else None
        if parsed is None:
            eos = self.template.eos_token_ids
            body = sampled[:-1] if sampled and sampled[-1] in eos else sampled
            text = self.template.decode(body)
            if stop_sequence and stop_sequence in text:
                text = text[: text.index(stop_sequence)]
            parsed = self.template.parse(text, enable_thinking=request.thinking.enabled, finish_reason=finish,
                                         tools=self._tools(request) or [], prompt_ids=prompt_ids)
        if finish == "length":
            reason = "length"
        elif parsed.tool_calls:
            reason = "tool_calls"
        elif stop_sequence:
            reason = "stop_sequence"
        else:
            reason = "stop"
        return ChatResult(
            id=call_id,
            model=self.chat.served_model or "",
            created=int(time.time()),
            content=parsed.content,
            reasoning=Reasoning(text=parsed.reasoning) if parsed.reasoning else None,
            tool_calls=parsed.tool_calls,
            finish_reason=reason,
            stop_sequence=stop_sequence,
            usage=Usage(prompt_tokens=len(prompt_ids), completion_tokens=len(sampled)),
            prompt_token_ids=prompt_ids if isinstance(prompt_ids, np.ndarray) else list(prompt_ids),
            completion_token_ids=list(sampled),
            completion_logprobs=logprobs,
            weight_version=version,
            malformed=list(parsed.malformed),
        )


def _has_images(request: ChatRequest) -> bool:
    return any(holds_image(m) for m in request.messages)


class _Labelled:
    """A chat stream whose result says how its prompt was built."""

    def __init__(self, inner: UpstreamStream, mode: str):
        self.inner, self.mode = inner, mode

    @property
    def prompt_tokens(self) -> int | None:
        return self.inner.prompt_tokens

    async def accepted(self, timeout: float | None) -> bool:
        return await self.inner.accepted(timeout)

    def __aiter__(self):
        return aiter(self.inner)

    def result(self) -> ChatResult:
        return self.inner.result().model_copy(update={"prompt_mode": self.mode})

    def partial(self) -> ChatResult:
        return self.inner.partial().model_copy(update={"prompt_mode": self.mode})

    async def aclose(self) -> None:
        await self.inner.aclose()


def _from_generate(data: Any):
    try:
        choice = data["choices"][0]
        ids = list(choice["token_ids"])
        content = (choice.get("logprobs") or {}).get("content") or []
        logprobs = logprobs_or_none([c.get("logprob") for c in content], len(ids))
        return ids, logprobs, choice.get("finish_reason") or "stop", choice.get("stop_reason"), weight_version(choice)
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise GatewayError("upstream_error", f"the upstream's generate answer has no token ids ({exc})") from None


def _from_completions(data: Any):
    try:
        choice = data["choices"][0]
        ids = list(choice["token_ids"])
        lp = choice.get("logprobs") or {}
        logprobs = logprobs_or_none(lp.get("token_logprobs") or [], len(ids))
        return ids, logprobs, choice.get("finish_reason") or "stop", choice.get("stop_reason"), None
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise GatewayError("upstream_error", f"the upstream's completion answer has no token ids ({exc})") from None
