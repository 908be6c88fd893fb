"""The one chat request and result every provider format is normalised into.

Providers translate *into* `ChatRequest` and *out of* `ChatResult`; the upstream backends
only ever see these types. Keeping this vocabulary small is what lets four wire formats
share one pipeline, one capture schema and one token-faithful prompt builder.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from itertools import groupby
from typing import Annotated, Any, Literal, Union

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, PlainSerializer, WrapValidator

from polar.object_memo import ObjectMemo


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TextPart(_Model):
    type: Literal["text"] = "text"
    text: str


class ImagePart(_Model):
    """An image given inline (base64 `data` + `media_type`) or by `url`."""

    type: Literal["image"] = "image"
    media_type: str | None = None
    data: str | None = None
    url: str | None = None


Part = Annotated[Union[TextPart, ImagePart], Field(discriminator="type")]


class ToolCall(_Model):
    id: str
    name: str
    # The arguments exactly as the model produced them (a JSON text). Kept as a string so that
    # compact/spaced JSON written by the model is never re-serialised on its way back.
    arguments: str = "{}"

    def arguments_obj(self) -> Any:
        """Arguments as a JSON value; text that is not JSON comes back as {"_raw": text}."""
        try:
            return json.loads(self.arguments) if self.arguments.strip() else {}
        except json.JSONDecodeError:
            return {"_raw": self.arguments}


class Reasoning(_Model):
    """A thinking block. `signature` is the provider-opaque token the client must send back."""

    text: str = ""
    signature: str | None = None
    redacted: bool = False  # Anthropic redacted_thinking: `text` holds the opaque data


class Message(_Model):
    """One message of a conversation. Once a provider has read it, a message is never modified: a session's
    later calls share it (providers/history.py), and what is derived from it is kept per object."""

    role: Literal["system", "user", "assistant", "tool"]
    content: list[Part] = Field(default_factory=list)
    # assistant only
    reasoning: list[Reasoning] = Field(default_factory=list)
    tool_calls: list[ToolCall] = Field(default_factory=list)
    # tool only
    tool_call_id: str | None = None
    name: str | None = None
    is_error: bool = False

    def text(self) -> str:
        return "".join(p.text for p in self.content if isinstance(p, TextPart))

    def reasoning_text(self) -> str:
        return "".join(r.text for r in self.reasoning if not r.redacted)


class Tool(_Model):
    name: str
    description: str | None = None
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})


class ToolChoice(_Model):
    mode: Literal["auto", "none", "required", "tool"] = "auto"
    name: str | None = None  # with mode="tool"


class Sampling(_Model):
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    stop: list[str] = Field(default_factory=list)
    seed: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None


class Thinking(_Model):
    """Whether the client asked for reasoning. None = the client said nothing (model default)."""

    enabled: bool | None = None
    budget_tokens: int | None = None
    effort: str | None = None


class ChatRequest(_Model):
    model: str
    messages: list[Message]
    tools: list[Tool] = Field(default_factory=list)
    tool_choice: ToolChoice = Field(default_factory=ToolChoice)
    parallel_tool_calls: bool | None = None
    sampling: Sampling = Field(default_factory=Sampling)
    thinking: Thinking = Field(default_factory=Thinking)
    stream: bool = False
    # JSON schema the answer must follow (OpenAI response_format / Gemini responseJsonSchema).
    response_schema: dict[str, Any] | None = None
    # The id of an earlier answer this request continues (Responses `previous_response_id`): the
    # gateway prepends that call's conversation and answer before the upstream sees the request.
    continues: str | None = None
    # The client's own request metadata (Anthropic `metadata`, Responses `metadata`), kept on the
    # capture as the client's tags; polar itself never reads it.
    metadata: dict[str, Any] = Field(default_factory=dict)

    def stored(self) -> dict[str, Any]:
        """The request as its capture row holds it: JSON values, fields at None left out. Messages hold
        only strings, booleans and lists, whose Python form is their JSON form, so they are dumped in
        Python mode: pydantic's JSON mode with exclude_none costs ~4x as much (1.6 vs 0.4 ms for an
        agent's 240 messages, on every call). Each message and tool is dumped once (`stored_form`,
        `stored_tool`): the history and tools a call repeats give back the dicts of earlier calls, which
        nothing modifies. The rest (sampling, metadata: any JSON value) goes through JSON mode."""
        rest = self.model_dump(mode="json", exclude_none=True, exclude={"messages", "tools"})
        out = {name: [stored_tool(t) for t in self.tools] if name == "tools" else rest[name]
               for name in type(self).model_fields if name in rest or name == "tools"}
        out["messages"] = [stored_form(m) for m in self.messages]
        return out


# A message, and a tool, as a capture row holds it (see ChatRequest.stored), once per object. Read-only.
stored_form = ObjectMemo(lambda message: message.model_dump(exclude_none=True))
stored_tool = ObjectMemo(lambda tool: tool.model_dump(mode="json", exclude_none=True))
# Whether a message holds an image, once per message: every call checks its whole history for them.
holds_image = ObjectMemo(lambda message: any(isinstance(p, ImagePart) for p in message.content))


FinishReason = Literal["stop", "length", "tool_calls", "stop_sequence", "content_filter"]


class Usage(_Model):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    reasoning_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


def _array_as_is(value: Any, validate: Any) -> Any:
    # A token-faithful prompt is built as a uint32 array (100k+ ids at agent size): kept as it is, not
    # made a list of Python ints and validated one by one on every call.
    return value if isinstance(value, np.ndarray) else validate(value)


# Token ids: a list of ints, or the array polar built them in; either dumps as a list.
TokenIds = Annotated[list[int], WrapValidator(_array_as_is),
                     PlainSerializer(lambda ids: ids.tolist() if isinstance(ids, np.ndarray) else ids)]


class ChatResult(_Model):
    """One sampled assistant turn, with the token-level truth behind it."""

    id: str
    model: str
    created: int
    content: str = ""
    reasoning: Reasoning | None = None
    tool_calls: list[ToolCall] = Field(default_factory=list)
    finish_reason: FinishReason = "stop"
    stop_sequence: str | None = None
    usage: Usage = Field(default_factory=Usage)
    prompt_token_ids: TokenIds = Field(default_factory=list)
    completion_token_ids: list[int] = Field(default_factory=list)
    # None when the upstream gave no logprob for some sampled token (never invented).
    completion_logprobs: list[float] | None = Field(default_factory=list)
    # The upstream's own label for the weights that sampled it (vLLM's `weight_version`), when it reports one.
    weight_version: str | None = None
    # How the prompt ids were built: "chat-template" (vLLM rendered it), "token-faithful",
    # or "re-render: <why the earlier turn's ids could not be kept>".
    prompt_mode: str = "chat-template"
    # Tool calls the model wrote that could not be parsed (kept in `content`, reported here).
    malformed: list[str] = Field(default_factory=list)
    # The fleet replica that sampled it (polar/upstream/fleet); None behind a single upstream.
    replica: str | None = None
    # Replicas that failed this call before `replica` answered it, and how (a fleet retries once).
    failovers: list[str] = Field(default_factory=list)


# -- streaming: one sampled turn as it is produced, piece by piece -----------------------------
# Plain slotted dataclasses, not pydantic: one is made per sampled token on the streaming hot path.


@dataclass(slots=True)
class ReasoningDelta:
    """More reasoning text."""

    text: str


@dataclass(slots=True)
class TextDelta:
    """More answer text."""

    text: str


@dataclass(slots=True)
class ToolCallDelta:
    """A piece of tool call number `index` (0, 1, … in the order the model wrote them). Its first piece
    carries `id` and `name`; the `arguments` of its pieces concatenate to the call's arguments JSON text.
    A call known only once complete (token-faithful parsing) arrives as one piece with everything and
    `complete` set, so a client can act on it at once; otherwise a call ends where the next one starts."""

    index: int
    arguments: str = ""
    id: str | None = None
    name: str | None = None
    complete: bool = False


Delta = ReasoningDelta | TextDelta | ToolCallDelta


def coalesced(deltas: list[Delta]) -> list[Delta]:
    """Adjacent pieces of reasoning, or of text, as one: what arrived together goes out as one event
    (a client sees the same text in fewer events; every provider's stream takes any length)."""
    out: list[Delta] = []
    for kind, run in groupby(deltas, key=type):
        pieces = list(run)
        if kind is ToolCallDelta or len(pieces) == 1:
            out += pieces
        else:  # joined once: a slow client's backlog can be thousands of pieces
            out.append(kind("".join(piece.text for piece in pieces)))
    return out
