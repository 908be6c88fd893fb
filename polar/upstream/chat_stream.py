"""vLLM's streamed chat completion, read chunk by chunk into deltas and the token-level truth.

vLLM renders the template and runs its reasoning and tool parsers; each chunk brings that chunk's
sampled token ids and their logprobs (`return_token_ids`, `logprobs`), the first one also the prompt
ids, the last one the finish reason, then a usage chunk. The accumulated answer is what the
non-streamed endpoint would have answered.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import AsyncIterator
from typing import Any

import numpy as np

from polar.canonical import ChatRequest, ChatResult, Delta, ReasoningDelta, TextDelta, ToolCall, ToolCallDelta
from polar.errors import GatewayError
from polar.upstream.http import StreamRequest, response_json, take_batch
from polar.upstream.prompt_ids import read_chat_answer
from polar.upstream.results import chat_result, token_array


class ChatStream:
    def __init__(self, upstream: StreamRequest, request: ChatRequest, call_id: str, known: np.ndarray | None = None):
        self.upstream, self.request, self.call_id = upstream, request, call_id
        self.known = known  # the session's previous ids, which the first chunk's prompt ids most likely start with
        self.created = int(time.time())
        self.model = ""
        self.prompt_ids: np.ndarray | None = None
        self.ids: list[int] = []
        self.logprobs: list[Any] = []
        self.content: list[str] = []
        self.reasoning: list[str] = []
        # Template glue is held back until text follows, then sent or dropped as chat_result drops it: the
        # newlines around the reasoning, those opening the content, whitespace before a tool call.
        self.after_think = False  # the answer had a reasoning phase
        self.held_reasoning = ""
        self.held = ""
        self.calls: dict[int, list] = {}  # vLLM's index → [id, name, argument pieces]
        self.finish: str | None = None
        self.stop_reason: Any = None
        self.usage: dict[str, Any] = {}

    @property
    def prompt_tokens(self) -> int | None:
        return None if self.prompt_ids is None else len(self.prompt_ids)

    async def accepted(self, timeout: float | None) -> bool:
        return await self.upstream.accepted(timeout)

    async def __aiter__(self) -> AsyncIterator[list[Delta]]:
        url = self.upstream.url
        async for batch in self.upstream.batches():
            taken, failure, done = take_batch(batch, self._chunk, url, "a chat completion chunk")
            yield [delta for deltas in taken for delta in deltas]  # what came before a bad chunk goes out first
            if failure is not None:
                raise failure
            if done:
                break
        if self.finish is None:
            raise GatewayError("upstream_error", f"the upstream {url} ended its stream before the answer finished")
        if self.held and not self.calls:  # the answer's own trailing whitespace
            self.content.append(self.held)
            yield [TextDelta(self.held)]
        self.held = ""

    def _chunk(self, data: str) -> list[Delta]:
        """One chunk's deltas; the first one's prompt ids read past the session's (prompt_ids.py)."""
        return self._take(read_chat_answer(data, self.known) if self.prompt_ids is None else response_json(data))

    def _take(self, chunk: dict[str, Any]) -> list[Delta]:
        if "error" in chunk:  # vLLM's in-stream error: the generation failed after it started
            err = chunk["error"]
            raise GatewayError("upstream_error", f"the upstream failed mid-stream: {err.get('message', err)}")
        self.model = chunk.get("model") or self.model
        if chunk.get("prompt_token_ids") is not None:
            self.prompt_ids = token_array(chunk["prompt_token_ids"], "prompt_token_ids")
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        deltas: list[Delta] = []
        for choice in chunk.get("choices") or []:
            self.ids += choice.get("token_ids") or []
            self.logprobs += [item.get("logprob") for item in (choice.get("logprobs") or {}).get("content") or []]
            delta = choice.get("delta") or {}
            if text := delta.get("reasoning") or delta.get("reasoning_content"):
                deltas += self._reasoning(text)
            if text := delta.get("content"):
                deltas += self._text(text)
            for piece in delta.get("tool_calls") or []:
                self.held = ""  # whitespace touching a call is glue
                deltas.append(self._call_piece(piece))
            if choice.get("finish_reason") is not None:
                self.finish, self.stop_reason = choice["finish_reason"], choice.get("stop_reason")
        return deltas

    def _reasoning(self, text: str) -> list[Delta]:
        self.after_think = True
        if not self.reasoning:
            text = text.lstrip("\n")
        text = self.held_reasoning + text
        body = text.rstrip("\n")
        self.held_reasoning = text[len(body):]
        if not body:
            return []
        self.reasoning.append(body)
        return [ReasoningDelta(body)]

    def _text(self, text: str) -> list[Delta]:
        if not self.content and self.after_think:
            text = text.lstrip("\n")
        text, self.held = self.held + text, ""
        body = text.rstrip()
        self.held = text[len(body):]  # held until text follows (sent) or a call does (dropped)
        if not body:
            return []
        self.content.append(body)
        return [TextDelta(body)]

    def _call_piece(self, piece: dict[str, Any]) -> ToolCallDelta:
        index = piece.get("index", 0)
        function = piece.get("function") or {}
        arguments = function.get("arguments") or ""
        if index not in self.calls:
            self.calls[index] = [piece.get("id") or f"call_{secrets.token_hex(12)}", function.get("name") or "", []]
            call_id, name = self.calls[index][:2]
            self.calls[index][2].append(arguments)
            return ToolCallDelta(index, arguments, id=call_id, name=name)
        if function.get("name"):  # a parser that sends the name late
            self.calls[index][1] += function["name"]
        self.calls[index][2].append(arguments)
        return ToolCallDelta(index, arguments)

    def result(self) -> ChatResult:
        """The whole turn, once the stream has ended (or as far as it got)."""
        calls = [ToolCall(id=c[0], name=c[1], arguments="".join(c[2]) or "{}") for c in self.calls.values()]
        reasoning = "".join(self.reasoning) if self.after_think else None
        return chat_result(
            self.call_id, self.request, model=self.model, created=self.created, content="".join(self.content),
            reasoning=reasoning, tool_calls=calls, finish=self.finish,
            stop_reason=self.stop_reason, usage=self.usage, prompt_ids=self.prompt_ids if self.prompt_ids is not None else [],
            completion_ids=self.ids, logprobs=self.logprobs,
        )

    partial = result  # what was sampled before the stream broke off or was closed

    async def aclose(self) -> None:
        self.upstream.close()
