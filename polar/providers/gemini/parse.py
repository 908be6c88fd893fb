"""Gemini request → canonical request: the Code Assist envelope, the system instruction, and
`contents` folded into messages with function responses paired to their calls."""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from dataclasses import dataclass
from typing import Any

from polar.canonical import (
    ChatRequest,
    ImagePart,
    Message,
    Reasoning,
    TextPart,
    ToolCall,
)
from polar.providers.base import Parsed, Route
from polar.providers.fields import body_object, expect, invalid, optional, require
from polar.providers.fields import proto_names as k
from polar.providers.gemini.config import (
    response_schema,
    sampling,
    thinking,
    tool_choice,
    tools,
)
from polar.providers.history import History, read_history, read_part
from polar.providers.reasoning_seal import Sealer


@dataclass(frozen=True)
class CodeAssist:
    """The fields Gemini CLI's Code Assist envelope carries around the request."""

    project: str | None = None
    user_prompt_id: str | None = None
    session_id: str | None = None


@dataclass(frozen=True)
class GeminiContext:
    include_thoughts: bool = False  # thinkingConfig.includeThoughts: thought parts go back to the client
    code_assist: CodeAssist | None = None  # set when the request came in Gemini CLI's envelope


def parse_request(route: Route, body: Any, sealer: Sealer, history: History | None = None) -> Parsed[GeminiContext]:
    """`history`: the session's earlier reads of its contents, resumed where this request repeats them."""
    payload, model, where, envelope = _unwrap(route, body_object(body))
    if route.endpoint == "count_tokens":
        inner = optional(payload, k("generateContentRequest"), dict, where)
        if inner is not None:
            where += "generateContentRequest."
            payload, model = inner, model or optional(inner, k("model"), str, where)
    if not model:
        raise invalid(f"missing required field '{where}model'", f"{where}model")

    contents = require(payload, k("contents"), list, where)
    if route.endpoint == "generate" and not contents:
        raise invalid(f"field '{where}contents' must not be empty", f"{where}contents")
    gen = optional(payload, k("generationConfig"), dict, where) or {}
    gen_where = f"{where}generationConfig."
    wanted, include_thoughts = thinking(gen, gen_where)
    offered, builtin = read_part(history, "tools", payload.get("tools"), lambda: tools(payload, where))
    request = ChatRequest(
        model=model_name(model),
        messages=_system(payload, where, history) + read_history(contents, _Conversation(where, sealer), history),
        tools=offered,
        tool_choice=tool_choice(payload, where),
        sampling=sampling(gen, gen_where),
        thinking=wanted,
        stream=bool(route.stream) and route.endpoint == "generate",
        response_schema=response_schema(gen, gen_where),
    )
    rewrites = [f"built-in tool not offered to the model: {name}" for name in builtin]
    return Parsed(request, GeminiContext(include_thoughts=include_thoughts, code_assist=envelope), rewrites)


def model_name(model: str) -> str:
    """`models/x` and `x` name the same model; tuned models keep their `tunedModels/` prefix."""
    while model.startswith("models/"):
        model = model[len("models/") :]
    return model


def _unwrap(route: Route, body: dict) -> tuple[dict, str | None, str, CodeAssist | None]:
    """(request payload, model, field-path prefix, envelope) — opening the Code Assist envelope."""
    if not getattr(route, "code_assist", False):
        return body, route.model, "", None
    payload = require(body, "request", dict)
    envelope = CodeAssist(
        project=optional(body, "project", str),
        user_prompt_id=optional(body, "user_prompt_id", str),
        session_id=optional(payload, "session_id", str),
    )
    model = optional(body, "model", str) or optional(payload, k("model"), str, "request.")
    return payload, model, "request.", envelope


# ---- conversation ------------------------------------------------------------------------


def _system(payload: dict, where: str, history: History | None) -> list[Message]:
    """The system message: the same object while the session sends the same systemInstruction (memos: once)."""
    value = optional(payload, k("systemInstruction"), (str, dict), where)
    if value is None:
        return []
    return read_part(history, "system", value, lambda: _system_of(value, where))


def _system_of(value: str | dict, where: str) -> list[Message]:
    where = f"{where}systemInstruction"
    if isinstance(value, str):
        texts = [value]
    elif isinstance(value, dict):
        parts = require(value, k("parts"), list, where + ".")
        texts = [
            require(expect(p, dict, f"{where}.parts[{i}]"), k("text"), str, f"{where}.parts[{i}].") for i, p in enumerate(parts)
        ]
    return [Message(role="system", content=[TextPart(text="\n".join(texts))])] if texts else []


class _Conversation:
    """Turns `contents` into canonical messages, pairing function responses with their calls.

    Gemini ids on functionCall/functionResponse are optional. A call without one gets an id
    derived from its position (so the same history always yields the same ids); a response is
    paired by id when the id names an open call, otherwise with the oldest open call of the
    same name — Gemini CLI, for one, invents its own ids for responses to id-less calls.
    """

    def __init__(self, where: str, sealer: Sealer):
        self.where = where
        self.sealer = sealer
        self.messages: list[Message] = []
        self.notes: list[str] = []
        self.open_calls: list[ToolCall] = []

    # A `HistoryReader`: each content's messages are complete once it is read; the calls still waiting
    # for their responses are the state carried on.
    def checkpoint(self) -> tuple:
        return tuple(self.open_calls)

    def resume(self, messages: list[Message], notes: list[str], state: tuple) -> None:
        self.messages, self.notes, self.open_calls = messages, notes, list(state)

    def read(self, i: int, content: Any) -> None:
        where = f"{self.where}contents[{i}]"
        content = expect(content, dict, where)
        role = optional(content, "role", str, where + ".") or "user"
        parts = optional(content, k("parts"), list, where + ".") or []
        if role == "model":
            self.messages.append(self._assistant(i, parts, where))
        elif role in ("user", "function"):  # "function" is the legacy role of function responses
            self.messages.extend(self._user(i, parts, where))
        else:
            raise invalid(f"field '{where}.role' must be 'user' or 'model', got '{role}'", f"{where}.role")

    def _assistant(self, index: int, parts: list, where: str) -> Message:
        content: list[TextPart | ImagePart] = []
        thoughts: list[str] = []
        thought_signature: str | None = None
        first_signature: str | None = None
        calls: list[ToolCall] = []
        for j, raw in enumerate(parts):
            pw = f"{where}.parts[{j}]"
            part = expect(raw, dict, pw)
            signature = optional(part, k("thoughtSignature"), str, pw + ".")
            first_signature = first_signature or signature
            call = optional(part, k("functionCall"), dict, pw + ".")
            if call is not None:
                calls.append(self._call(call, f"{index}:{j}", pw + ".functionCall."))
            elif optional(part, k("thought"), bool, pw + ".") and optional(part, k("text"), str, pw + ".") is not None:
                thoughts.append(require(part, k("text"), str, pw + "."))
                thought_signature = thought_signature or signature
            elif signature is None or not _is_empty_text(part):
                _append_content(content, part, pw, merge_text=True)
        self.open_calls.extend(calls)
        reasoning = _reasoning(thoughts, thought_signature, first_signature, self.sealer)
        return Message(role="assistant", content=content, reasoning=reasoning, tool_calls=calls)

    def _call(self, call: dict, position: str, where: str) -> ToolCall:
        name = require(call, k("name"), str, where)
        args = optional(call, k("args"), dict, where)
        call_id = optional(call, k("id"), str, where) or _synthesized_id(position, name)
        return ToolCall(id=call_id, name=name, arguments=json.dumps(args or {}, ensure_ascii=False))

    def _user(self, index: int, parts: list, where: str) -> list[Message]:
        out: list[Message] = []
        pending: list[TextPart | ImagePart] = []
        for j, raw in enumerate(parts):
            pw = f"{where}.parts[{j}]"
            part = expect(raw, dict, pw)
            response = optional(part, k("functionResponse"), dict, pw + ".")
            if response is None:
                if optional(part, k("functionCall"), dict, pw + ".") is not None:
                    raise invalid(f"field '{pw}.functionCall' is only allowed in 'model' turns", f"{pw}.functionCall")
                _append_content(pending, part, pw)
                continue
            if pending:
                out.append(Message(role="user", content=pending))
                pending = []
            out.append(self._tool_result(response, f"{index}:{j}", pw + ".functionResponse."))
        if pending:
            out.append(Message(role="user", content=pending))
        return out

    def _tool_result(self, response: dict, position: str, where: str) -> Message:
        name = require(response, k("name"), str, where)
        call_id = self._pair(optional(response, k("id"), str, where), name) or _synthesized_id(position, name)
        payload = optional(response, k("response"), dict, where) or {}
        content: list[TextPart | ImagePart] = [TextPart(text=_result_text(payload))]
        for n, raw in enumerate(optional(response, k("parts"), list, where) or []):
            _append_content(content, expect(raw, dict, f"{where}parts[{n}]"), f"{where}parts[{n}]")
        is_error = set(payload) == {"error"}
        return Message(role="tool", content=content, tool_call_id=call_id, name=name, is_error=is_error)

    def _pair(self, response_id: str | None, name: str) -> str | None:
        """The id of the open call this response answers; else its own id (None if it has none)."""
        for by_id in (True, False):
            for n, call in enumerate(self.open_calls):
                if (call.id == response_id) if by_id else (call.name == name):
                    return self.open_calls.pop(n).id
        return response_id


def _synthesized_id(position: str, name: str) -> str:
    return "call_" + hashlib.sha256(f"{position}:{name}".encode()).hexdigest()[:24]


def _is_empty_text(part: dict) -> bool:
    """A signature-only carrier part (`{"text": "", "thoughtSignature": ...}`)."""
    return part.get("text") == "" and not any(k in part for k in ("inlineData", "inline_data", "fileData", "file_data"))


def _append_content(content: list[TextPart | ImagePart], part: dict, where: str, merge_text: bool = False) -> None:
    """Add one text/image part. `merge_text` joins a model turn's text parts: they are pieces
    of one streamed answer, not separate items as a user's parts are."""
    text = optional(part, k("text"), str, where + ".")
    if text is not None:
        if merge_text and content and isinstance(content[-1], TextPart):
            content[-1] = TextPart(text=content[-1].text + text)
        else:
            content.append(TextPart(text=text))
        return
    for key, field in (("inlineData", "data"), ("fileData", "fileUri")):
        media = optional(part, k(key), dict, where + ".")
        if media is None:
            continue
        mime = require(media, k("mimeType"), str, f"{where}.{key}.")
        if not mime.startswith("image/"):
            raise invalid(f"field '{where}.{key}.mimeType': only images are supported, got '{mime}'", f"{where}.{key}")
        value = require(media, k(field), str, f"{where}.{key}.")
        source = {"data": value} if field == "data" else {"url": value}
        content.append(ImagePart(media_type=mime, **source))
        return
    supported = "text, inlineData, fileData, functionCall, functionResponse"
    raise invalid(f"field '{where}' has no supported content ({supported})", where)


def _result_text(payload: dict) -> str:
    """A function result as the model sees it: a lone string field as the string, else JSON."""
    if len(payload) == 1:
        ((key, value),) = payload.items()
        if key in ("output", "result", "content", "error") and isinstance(value, str):
            return value
    return json.dumps(payload, ensure_ascii=False, separators=(",", ":"))


def _reasoning(
    thoughts: list[str], thought_signature: str | None, first_signature: str | None, sealer: Sealer
) -> list[Reasoning]:
    if thoughts:
        return [Reasoning(text="".join(thoughts), signature=thought_signature or first_signature)]
    text = _unseal_signature(first_signature, sealer)
    # A foreign signature (real Gemini's) carries nothing polar can read, so it is not kept.
    return [Reasoning(text=text, signature=first_signature)] if text else []


def _unseal_signature(signature: str | None, sealer: Sealer) -> str | None:
    if not signature:
        return None
    try:
        token = base64.b64decode(signature, validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        token = signature
    return sealer.unseal(token)
