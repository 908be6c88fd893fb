"""A token-faithful turn as vLLM samples it: token ids in, deltas out, the same turn as the whole answer.

vLLM's token-in endpoints stream token ids (and their logprobs) and nothing else: /inference/v1/generate
or /v1/completions with `stream: true`. Here the ids are decoded incrementally and parsed as they come
(polar/tokens/stream_parse.py), so reasoning, text and each finished tool call reach the client while
the model is still writing. The final result is built from the ids exactly as the non-streamed call
builds it (`TokenFaithful.result`), so the capture never depends on how the stream was cut.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any, Protocol

from polar.canonical import ChatRequest, ChatResult, Delta, ToolCallDelta
from polar.errors import GatewayError
from polar.tokens.stream_parse import IncrementalDecoder, TurnStream
from polar.tokens.template import ChatTemplate, openai_tools
from polar.upstream.http import StreamRequest, response_json, take_batch
from polar.upstream.results import weight_version


class TokenFaithful(Protocol):
    """What a stream needs of its backend (upstream/vllm_tokens.py, which imports this module): the template and
    the turn built from the sampled ids."""

    template: ChatTemplate

    def result(self, request: ChatRequest, call_id: str, prompt_ids: Sequence[int], sampled: list[int],
               logprobs: Any, finish: str, stop_reason: Any, version: str | None, parsed: Any = None) -> ChatResult: ...


class TokenStream:
    def __init__(self, upstream: StreamRequest, backend: TokenFaithful, request: ChatRequest, call_id: str,
                 prompt_ids: Sequence[int], mode: str):
        self.upstream, self.backend, self.request, self.call_id = upstream, backend, request, call_id
        self.prompt_ids, self.mode = prompt_ids, mode
        template = backend.template
        self.eos = set(template.eos_token_ids)
        self.decoder = IncrementalDecoder(template.tokenizer)
        self.turn = TurnStream(template.family, think_open=template.prompt_opens_think(prompt_ids, request.thinking.enabled),
                               tools=openai_tools(request.tools), stop_strings=request.sampling.stop)
        self.ids: list[int] = []
        self.logprobs: list[Any] = []
        self.finish: str | None = None
        self.stop_reason: Any = None
        self.weight_version: str | None = None

    @property
    def prompt_tokens(self) -> int:
        return len(self.prompt_ids)  # polar built the prompt: known before the first token

    async def accepted(self, timeout: float | None) -> bool:
        return await self.upstream.accepted(timeout)

    async def __aiter__(self) -> AsyncIterator[list[Delta]]:
        url = self.upstream.url
        async for batch in self.upstream.batches():
            # The chunks one read brought are decoded and parsed as one piece: the same text, in fewer steps.
            texts, failure, done = take_batch(batch, self._chunk, url, "a completion chunk with token ids")
            text = "".join(texts)
            yield _complete(self.turn.feed(text)) if text else []  # what came before a bad chunk goes out first
            if failure is not None:
                raise failure
            if done:
                break
        if self.finish is None:
            raise GatewayError("upstream_error", f"the upstream {url} ended its stream before the answer finished")
        # What the decoder still held (a character cut by the end of the sample): then the text fed is the
        # whole decode of the ids, as the non-streamed answer decodes them.
        last = _complete(self.turn.feed(self.decoder.finish()))
        yield last + _complete(self.turn.finish(self.finish))

    def _chunk(self, data: str) -> str:
        return self._take(response_json(data))

    def _take(self, chunk: dict[str, Any]) -> str:
        """Account for one chunk's tokens; the text they add."""
        if "error" in chunk:  # vLLM's in-stream error: the generation failed after it started
            err = chunk["error"]
            raise GatewayError("upstream_error", f"the upstream failed mid-stream: {err.get('message', err)}")
        text = []
        for choice in chunk.get("choices") or []:
            new = choice.get("token_ids") or []
            self.ids += new
            logprobs = choice.get("logprobs") or {}
            if "content" in logprobs:  # /inference/v1/generate: [{token_id, logprob, …}]
                self.logprobs += [item.get("logprob") for item in logprobs["content"] or []]
            else:  # /v1/completions: the legacy parallel lists
                self.logprobs += logprobs.get("token_logprobs") or []
            # A stop id ends the turn: its text is no part of the answer (as the whole answer is decoded).
            text.append(self.decoder.step([t for t in new if t not in self.eos]))
            if choice.get("finish_reason") is not None:
                self.finish, self.stop_reason = choice["finish_reason"], choice.get("stop_reason")
                self.weight_version = weight_version(choice)
        return "".join(text)

    def result(self) -> ChatResult:
        """The whole turn: the parse the stream made (the call ids its client holds), on the ids vLLM sent."""
        parsed = self.turn.result if self.turn.finished else None
        result = self.backend.result(self.request, self.call_id, self.prompt_ids, self.ids, self.logprobs,
                                     self.finish or "length", self.stop_reason, self.weight_version, parsed=parsed)
        result.prompt_mode = self.mode
        return result

    partial = result  # the ids sampled before the stream broke off or was closed (parsed as cut by a length limit)

    async def aclose(self) -> None:
        self.upstream.close()


def _complete(deltas: list[Delta]) -> list[Delta]:
    """A parsed call reaches the client whole: say so, so it can act on it at once."""
    for delta in deltas:
        if isinstance(delta, ToolCallDelta):
            delta.complete = True
    return deltas
