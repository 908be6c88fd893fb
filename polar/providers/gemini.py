"""Google Gemini `generateContent` / `streamGenerateContent` / `countTokens`.

Two front doors speak this format: the public API (`/v1beta/models/{model}:method`, used with an
API key by the google-genai SDKs and Gemini CLI) and Gemini CLI's "Login with Google" path, the
Code Assist service (`/v1internal:method`), which wraps the same request in
{"model", "project", "user_prompt_id", "request": {...}} and the same response in
{"response": {...}, "traceId"}. Both are parsed and rendered here; `GeminiRoute.code_assist`
remembers which envelope the client expects.

Field names: the real API is protobuf JSON, which accepts both lowerCamel and snake_case names,
and the Python SDK really does send some nested objects snake_case (`thinkingConfig`
arrives as {"include_thoughts": true, "thinking_budget": ...}); so every lookup tries both.

Reasoning: Gemini CLI drops `thought: true` parts from its history and keeps only the
`thoughtSignature` of the other parts, so the signature polar mints *carries* the reasoning
(`reasoning_seal.seal`) rather than just authenticating it. It is base64 of the sealed token,
because the Python SDK types `thoughtSignature` as bytes and rejects anything that is not base64.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

from polar.canonical import (
    ChatRequest,
    ChatResult,
    ImagePart,
    Message,
    Reasoning,
    Sampling,
    TextPart,
    Thinking,
    Tool,
    ToolCall,
    ToolChoice,
)
from polar.errors import GatewayError, invalid, optional, require
from polar.providers.base import HttpReply, Provider, Route, sse_event
from polar.providers.reasoning_seal import seal, unseal

_PUBLIC_PATH = re.compile(
    r"^/(?P<version>v1|v1beta|v1alpha)/(?P<model>[^:]+):(?P<method>generateContent|streamGenerateContent|countTokens)$"
)
_CODE_ASSIST_PATH = re.compile(r"^/v1internal:(?P<method>generateContent|streamGenerateContent|countTokens)$")

# Gemini ends a tool-calling turn with plain STOP; it has no tool-specific finish reason.
_FINISH = {
    "stop": "STOP",
    "tool_calls": "STOP",
    "stop_sequence": "STOP",
    "length": "MAX_TOKENS",
    "content_filter": "SAFETY",
}

# kind → (HTTP code, google.rpc status). Google's code and status always travel as a pair.
_ERRORS: dict[str, tuple[int, str]] = {
    "invalid_request": (400, "INVALID_ARGUMENT"),
    "context_length": (400, "INVALID_ARGUMENT"),
    "too_large": (400, "INVALID_ARGUMENT"),  # Google answers oversized payloads with 400, not 413
    "authentication": (401, "UNAUTHENTICATED"),
    "permission": (403, "PERMISSION_DENIED"),
    "not_found": (404, "NOT_FOUND"),
    "rate_limit": (429, "RESOURCE_EXHAUSTED"),
    "upstream_error": (500, "INTERNAL"),
    "internal": (500, "INTERNAL"),
    "upstream_unavailable": (503, "UNAVAILABLE"),
    "upstream_timeout": (504, "DEADLINE_EXCEEDED"),
}

# OpenAPI-subset Schema fields that are int64, which protobuf JSON may send as strings ("1").
_INT64_SCHEMA_KEYS = {"minItems", "maxItems", "minLength", "maxLength", "minProperties", "maxProperties"}

# Streamed text is cut into pieces of this many characters, one chunk each.
_PIECE_CHARS = 64

# Nominal limits for the model listing: the interface passes model names only.
_INPUT_TOKEN_LIMIT = 1_048_576
_OUTPUT_TOKEN_LIMIT = 65_536


@dataclass
class GeminiRoute(Route):
    code_assist: bool = False  # Gemini CLI's /v1internal envelope on request and response


class GeminiGenerate(Provider):
    name = "gemini"

    # ---- routing -------------------------------------------------------------------------

    def match(self, method: str, path: str, query: dict[str, str], headers: dict[str, str]) -> Route | None:
        if method.upper() != "POST":
            return None
        path = unquote(path.split("?", 1)[0])  # clients may send the colon as %3A
        if m := _CODE_ASSIST_PATH.match(path):
            return self._route(m["method"], None, query, code_assist=True)
        if m := _PUBLIC_PATH.match(path):
            return self._route(m["method"], _model_name(m["model"]), query, code_assist=False)
        return None

    def _route(self, method: str, model: str | None, query: dict[str, str], code_assist: bool) -> GeminiRoute:
        endpoint = "count_tokens" if method == "countTokens" else "generate"
        stream = method == "streamGenerateContent"
        return GeminiRoute(self, endpoint, model, stream, dict(query), code_assist=code_assist)

    # ---- request -------------------------------------------------------------------------

    def parse(self, route: Route, body: Any) -> ChatRequest:
        if not isinstance(body, dict):
            raise invalid("request body must be a JSON object")
        payload, model, where, metadata = _unwrap(route, body)
        if route.endpoint == "count_tokens":
            inner = _opt(payload, "generateContentRequest", dict, where)
            if inner is not None:
                where += "generateContentRequest."
                payload, model = inner, model or _opt(inner, "model", str, where)
        if not model:
            raise invalid(f"missing required field '{where}model'", f"{where}model")

        contents = _req(payload, "contents", list, where)
        if route.endpoint == "generate" and not contents:
            raise invalid(f"field '{where}contents' must not be empty", f"{where}contents")
        gen = _opt(payload, "generationConfig", dict, where) or {}
        gen_where = f"{where}generationConfig."
        thinking, include_thoughts = _thinking(gen, gen_where)
        metadata["gemini"] = {"include_thoughts": include_thoughts}

        return ChatRequest(
            model=_model_name(model),
            messages=_system(payload, where) + _Conversation(where).messages(contents),
            tools=_tools(payload, where),
            tool_choice=_tool_choice(payload, where),
            sampling=_sampling(gen, gen_where),
            thinking=thinking,
            stream=bool(route.stream) and route.endpoint == "generate",
            response_schema=_response_schema(gen, gen_where),
            metadata=metadata,
        )

    # ---- responses -----------------------------------------------------------------------

    def render(self, route: Route, request: ChatRequest, result: ChatResult) -> HttpReply:
        parts = _parts(request, result, piece_chars=_PIECE_CHARS if route.stream else None)
        if not route.stream:
            return HttpReply.json(_envelope(route, result, _response(request, result, parts, final=True)))
        chunks = [_envelope(route, result, c) for c in _chunks(request, result, parts)]
        if route.query.get("alt") == "sse":
            return HttpReply.sse(b"".join(sse_event(c) for c in chunks))
        return HttpReply.json(chunks)  # without alt=sse the API streams one JSON array

    def render_count(self, route: Route, input_tokens: int) -> HttpReply:
        details = [{"modality": "TEXT", "tokenCount": input_tokens}]
        return HttpReply.json({"totalTokens": input_tokens, "promptTokensDetails": details})

    def render_error(self, error: GatewayError) -> HttpReply:
        code, status = _ERRORS.get(error.kind, (500, "INTERNAL"))
        message = error.message
        if error.kind == "context_length" and "input token count" not in message:
            message = f"The input token count exceeds the maximum number of tokens allowed. {message}"
        body: dict[str, Any] = {"code": code, "message": message, "status": status}
        if error.param and status == "INVALID_ARGUMENT":
            body["details"] = [
                {
                    "@type": "type.googleapis.com/google.rpc.BadRequest",
                    "fieldViolations": [{"field": error.param, "description": message}],
                }
            ]
        return HttpReply.json({"error": body}, status=code)

    def render_models(self, models: list[str]) -> HttpReply:
        listing = [
            {
                "name": f"models/{m}",
                "displayName": m,
                "supportedGenerationMethods": ["generateContent", "countTokens"],
                "inputTokenLimit": _INPUT_TOKEN_LIMIT,
                "outputTokenLimit": _OUTPUT_TOKEN_LIMIT,
            }
            for m in models
        ]
        return HttpReply.json({"models": listing})


# ---- field access: lowerCamel or snake_case ---------------------------------------------


def _key(obj: dict, camel: str) -> str:
    if camel in obj:
        return camel
    snake = re.sub(r"[A-Z]", lambda m: "_" + m[0].lower(), camel)
    return snake if snake in obj else camel


def _opt(obj: dict, camel: str, typ: type | tuple[type, ...], where: str = "") -> Any:
    return optional(obj, _key(obj, camel), typ, where)


def _req(obj: dict, camel: str, typ: type | tuple[type, ...], where: str = "") -> Any:
    return require(obj, _key(obj, camel), typ, where)


def _opt_int(obj: dict, camel: str, where: str) -> int | None:
    value = _opt(obj, camel, (int, float), where)
    if isinstance(value, float) and not value.is_integer():
        raise invalid(f"field '{where}{camel}' must be an integer", f"{where}{camel}")
    return None if value is None else int(value)


def _opt_float(obj: dict, camel: str, where: str) -> float | None:
    value = _opt(obj, camel, (int, float), where)
    return None if value is None else float(value)


def _model_name(model: str) -> str:
    """`models/x` and `x` name the same model; tuned models keep their `tunedModels/` prefix."""
    while model.startswith("models/"):
        model = model[len("models/") :]
    return model


def _unwrap(route: Route, body: dict) -> tuple[dict, str | None, str, dict[str, Any]]:
    """(request payload, model, field-path prefix, metadata) — opening the Code Assist envelope."""
    if not getattr(route, "code_assist", False):
        return body, route.model, "", {}
    payload = require(body, "request", dict)
    envelope = {
        "project": optional(body, "project", str),
        "user_prompt_id": optional(body, "user_prompt_id", str),
        "session_id": optional(payload, "session_id", str),
    }
    model = optional(body, "model", str) or _opt(payload, "model", str, "request.")
    return payload, model, "request.", {"code_assist": envelope}


# ---- conversation ------------------------------------------------------------------------


def _system(payload: dict, where: str) -> list[Message]:
    key = _key(payload, "systemInstruction")
    value = payload.get(key)
    if value is None:
        return []
    where = f"{where}{key}"
    if isinstance(value, str):
        texts = [value]
    elif isinstance(value, dict):
        parts = _req(value, "parts", list, where + ".")
        texts = [
            _req(_part_obj(p, f"{where}.parts[{i}]"), "text", str, f"{where}.parts[{i}].") for i, p in enumerate(parts)
        ]
    else:
        raise invalid(f"field '{where}' must be an object or a string", where)
    return [Message(role="system", content=[TextPart(text="\n".join(texts))])] if texts else []


def _part_obj(part: Any, where: str) -> dict:
    if not isinstance(part, dict):
        raise invalid(f"field '{where}' must be an object", where)
    return part


class _Conversation:
    """Turns `contents` into canonical messages, pairing function responses with their calls.

    Gemini ids on functionCall/functionResponse are optional. A call without one gets an id
    derived from its position (so the same history always yields the same ids); a response is
    paired by id when the id names an open call, otherwise with the oldest open call of the
    same name — Gemini CLI, for one, invents its own ids for responses to id-less calls.
    """

    def __init__(self, where: str):
        self.where = where
        self.open_calls: list[ToolCall] = []

    def messages(self, contents: list) -> list[Message]:
        out: list[Message] = []
        for i, content in enumerate(contents):
            where = f"{self.where}contents[{i}]"
            content = _part_obj(content, where)
            role = optional(content, "role", str, where + ".") or "user"
            parts = _opt(content, "parts", list, where + ".") or []
            if role == "model":
                out.append(self._assistant(i, parts, where))
            elif role in ("user", "function"):  # "function" is the legacy role of function responses
                out.extend(self._user(i, parts, where))
            else:
                raise invalid(f"field '{where}.role' must be 'user' or 'model', got '{role}'", f"{where}.role")
        return out

    def _assistant(self, index: int, parts: list, where: str) -> Message:
        content: list[TextPart | ImagePart] = []
        thoughts: list[str] = []
        thought_signature: str | None = None
        first_signature: str | None = None
        calls: list[ToolCall] = []
        for j, raw in enumerate(parts):
            pw = f"{where}.parts[{j}]"
            part = _part_obj(raw, pw)
            signature = _opt(part, "thoughtSignature", str, pw + ".")
            first_signature = first_signature or signature
            call = _opt(part, "functionCall", dict, pw + ".")
            if call is not None:
                calls.append(self._call(call, f"{index}:{j}", pw + ".functionCall."))
            elif _opt(part, "thought", bool, pw + ".") and _key(part, "text") in part:
                thoughts.append(_req(part, "text", str, pw + "."))
                thought_signature = thought_signature or signature
            elif signature is None or not _is_empty_text(part):
                _append_content(content, part, pw, merge_text=True)
        self.open_calls.extend(calls)
        reasoning = _reasoning(thoughts, thought_signature, first_signature)
        return Message(role="assistant", content=content, reasoning=reasoning, tool_calls=calls)

    def _call(self, call: dict, position: str, where: str) -> ToolCall:
        name = _req(call, "name", str, where)
        args = _opt(call, "args", dict, where)
        call_id = _opt(call, "id", str, where) or _synthesized_id(position, name)
        return ToolCall(id=call_id, name=name, arguments=json.dumps(args or {}, ensure_ascii=False))

    def _user(self, index: int, parts: list, where: str) -> list[Message]:
        out: list[Message] = []
        pending: list[TextPart | ImagePart] = []
        for j, raw in enumerate(parts):
            pw = f"{where}.parts[{j}]"
            part = _part_obj(raw, pw)
            response = _opt(part, "functionResponse", dict, pw + ".")
            if response is None:
                if _opt(part, "functionCall", dict, pw + ".") is not None:
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
        name = _req(response, "name", str, where)
        call_id = self._pair(_opt(response, "id", str, where), name) or _synthesized_id(position, name)
        payload = _opt(response, "response", dict, where) or {}
        content: list[TextPart | ImagePart] = [TextPart(text=_result_text(payload))]
        for k, raw in enumerate(_opt(response, "parts", list, where) or []):
            _append_content(content, _part_obj(raw, f"{where}parts[{k}]"), f"{where}parts[{k}]")
        is_error = set(payload) == {"error"}
        return Message(role="tool", content=content, tool_call_id=call_id, name=name, is_error=is_error)

    def _pair(self, response_id: str | None, name: str) -> str | None:
        """The id of the open call this response answers; else its own id (None if it has none)."""
        for by_id in (True, False):
            for k, call in enumerate(self.open_calls):
                if (call.id == response_id) if by_id else (call.name == name):
                    return self.open_calls.pop(k).id
        return response_id


def _synthesized_id(position: str, name: str) -> str:
    return "call_" + hashlib.sha256(f"{position}:{name}".encode()).hexdigest()[:24]


def _is_empty_text(part: dict) -> bool:
    """A signature-only carrier part (`{"text": "", "thoughtSignature": ...}`)."""
    return part.get("text") == "" and not any(k in part for k in ("inlineData", "inline_data", "fileData", "file_data"))


def _append_content(content: list[TextPart | ImagePart], part: dict, where: str, merge_text: bool = False) -> None:
    """Add one text/image part. `merge_text` joins a model turn's text parts: they are pieces
    of one streamed answer, not separate items as a user's parts are."""
    text = _opt(part, "text", str, where + ".")
    if text is not None:
        if merge_text and content and isinstance(content[-1], TextPart):
            content[-1] = TextPart(text=content[-1].text + text)
        else:
            content.append(TextPart(text=text))
        return
    for key, field in (("inlineData", "data"), ("fileData", "fileUri")):
        media = _opt(part, key, dict, where + ".")
        if media is None:
            continue
        mime = _req(media, "mimeType", str, f"{where}.{key}.")
        if not mime.startswith("image/"):
            raise invalid(f"field '{where}.{key}.mimeType': only images are supported, got '{mime}'", f"{where}.{key}")
        value = _req(media, field, str, f"{where}.{key}.")
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


def _reasoning(thoughts: list[str], thought_signature: str | None, first_signature: str | None) -> list[Reasoning]:
    if thoughts:
        return [Reasoning(text="".join(thoughts), signature=thought_signature or first_signature)]
    text = _unseal_signature(first_signature)
    # A foreign signature (real Gemini's) carries nothing polar can read, so it is not kept.
    return [Reasoning(text=text, signature=first_signature)] if text else []


def _unseal_signature(signature: str | None) -> str | None:
    if not signature:
        return None
    try:
        token = base64.b64decode(signature, validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        token = signature
    return unseal(token)


def _signature(reasoning_text: str) -> str:
    return base64.b64encode(seal(reasoning_text).encode()).decode()


# ---- tools and generation config ---------------------------------------------------------


def _tools(payload: dict, where: str) -> list[Tool]:
    out: list[Tool] = []
    for i, tool in enumerate(_opt(payload, "tools", list, where) or []):
        tw = f"{where}tools[{i}]"
        tool = _part_obj(tool, tw)
        # Built-in tools (googleSearch, codeExecution, urlContext, ...) have no local meaning.
        for k, decl in enumerate(_opt(tool, "functionDeclarations", list, tw + ".") or []):
            dw = f"{tw}.functionDeclarations[{k}]"
            out.append(_declaration(_part_obj(decl, dw), dw + "."))
    return out


def _declaration(decl: dict, where: str) -> Tool:
    json_schema = _opt(decl, "parametersJsonSchema", dict, where)
    schema = _opt(decl, "parameters", dict, where)
    if json_schema is not None:
        parameters = json_schema
    elif schema is not None:
        parameters = _json_schema(schema, where + "parameters")
    else:
        parameters = {"type": "object", "properties": {}}
    name = _req(decl, "name", str, where)
    return Tool(name=name, description=_opt(decl, "description", str, where), parameters=parameters)


def _json_schema(schema: Any, where: str) -> dict[str, Any]:
    """Gemini's OpenAPI-subset Schema ("type": "OBJECT", "nullable": true, ...) → JSON Schema."""
    if not isinstance(schema, dict):
        raise invalid(f"field '{where}' must be an object", where)
    out: dict[str, Any] = {}
    for raw_key, value in schema.items():
        key = re.sub(r"_([a-z])", lambda m: m[1].upper(), raw_key)
        if key == "type":
            if not isinstance(value, str):
                raise invalid(f"field '{where}.type' must be a string", f"{where}.type")
            if value.upper() != "TYPE_UNSPECIFIED":
                out["type"] = value.lower()
        elif key == "properties":
            if not isinstance(value, dict):
                raise invalid(f"field '{where}.properties' must be an object", f"{where}.properties")
            out[key] = {name: _json_schema(sub, f"{where}.properties.{name}") for name, sub in value.items()}
        elif key == "items":
            out[key] = _json_schema(value, f"{where}.items")
        elif key == "anyOf":
            if not isinstance(value, list):
                raise invalid(f"field '{where}.anyOf' must be an array", f"{where}.anyOf")
            out[key] = [_json_schema(sub, f"{where}.anyOf[{n}]") for n, sub in enumerate(value)]
        elif key in _INT64_SCHEMA_KEYS and isinstance(value, str) and value.isdigit():
            out[key] = int(value)
        elif key not in ("nullable", "propertyOrdering"):  # ordering is a Gemini decoding hint
            out[key] = value
    if schema.get("nullable") is True and isinstance(out.get("type"), str):
        out["type"] = [out["type"], "null"]
    return out


def _tool_choice(payload: dict, where: str) -> ToolChoice:
    config = _opt(payload, "toolConfig", dict, where) or {}
    calling = _opt(config, "functionCallingConfig", dict, f"{where}toolConfig.") or {}
    where = f"{where}toolConfig.functionCallingConfig."
    mode = (_opt(calling, "mode", str, where) or "AUTO").upper()
    allowed = _opt(calling, "allowedFunctionNames", list, where) or []
    if mode in ("AUTO", "VALIDATED", "MODE_UNSPECIFIED"):
        return ToolChoice(mode="auto")
    if mode == "NONE":
        return ToolChoice(mode="none")
    if mode == "ANY":
        if len(allowed) == 1 and isinstance(allowed[0], str):
            return ToolChoice(mode="tool", name=allowed[0])
        return ToolChoice(mode="required")
    raise invalid(f"field '{where}mode' must be AUTO, ANY, NONE or VALIDATED, got '{mode}'", f"{where}mode")


def _sampling(gen: dict, where: str) -> Sampling:
    candidates = _opt_int(gen, "candidateCount", where)
    if candidates is not None and candidates > 1:
        message = f"field '{where}candidateCount': only 1 candidate is supported, got {candidates}"
        raise invalid(message, f"{where}candidateCount")
    stop = _opt(gen, "stopSequences", list, where) or []
    if not all(isinstance(s, str) for s in stop):
        raise invalid(f"field '{where}stopSequences' must be an array of strings", f"{where}stopSequences")
    return Sampling(
        max_tokens=_opt_int(gen, "maxOutputTokens", where),
        temperature=_opt_float(gen, "temperature", where),
        top_p=_opt_float(gen, "topP", where),
        top_k=_opt_int(gen, "topK", where),
        stop=stop,
        seed=_opt_int(gen, "seed", where),
        presence_penalty=_opt_float(gen, "presencePenalty", where),
        frequency_penalty=_opt_float(gen, "frequencyPenalty", where),
    )


def _thinking(gen: dict, where: str) -> tuple[Thinking, bool]:
    """(canonical thinking request, whether thought parts go back to the client).

    Gemini thinks by default and only *shows* thoughts with includeThoughts; a budget of 0
    turns thinking off, -1 means "dynamic" (no fixed budget).
    """
    config = _opt(gen, "thinkingConfig", dict, where)
    if config is None:
        return Thinking(), False
    where = f"{where}thinkingConfig."
    include = bool(_opt(config, "includeThoughts", bool, where))
    budget = _opt_int(config, "thinkingBudget", where)
    level = _opt(config, "thinkingLevel", str, where)
    effort = level.lower() if level and level.upper() != "THINKING_LEVEL_UNSPECIFIED" else None
    if budget == 0:
        return Thinking(enabled=False), include
    enabled = True if (include or budget is not None or effort) else None
    return Thinking(enabled=enabled, budget_tokens=budget if budget and budget > 0 else None, effort=effort), include


def _response_schema(gen: dict, where: str) -> dict[str, Any] | None:
    json_schema = _opt(gen, "responseJsonSchema", dict, where)
    if json_schema is not None:
        return json_schema
    schema = _opt(gen, "responseSchema", dict, where)
    return None if schema is None else _json_schema(schema, where + "responseSchema")


# ---- rendering ---------------------------------------------------------------------------


def _parts(request: ChatRequest, result: ChatResult, piece_chars: int | None) -> list[dict[str, Any]]:
    """Response parts in order: thoughts (when asked for), text, function calls.

    Text is cut into pieces when streaming. The sealed reasoning rides on the first function
    call, else the first text piece — the parts a client keeps in its history (Gemini CLI
    merges consecutive text parts into the first one, dropping later parts' other fields).
    """
    reasoning = result.reasoning.text if result.reasoning else ""
    parts: list[dict[str, Any]] = []
    if reasoning and request.metadata.get("gemini", {}).get("include_thoughts"):
        parts += [{"text": piece, "thought": True} for piece in _pieces(reasoning, piece_chars)]
    parts += [{"text": piece} for piece in _pieces(result.content, piece_chars)]
    parts += [{"functionCall": {"id": c.id, "name": c.name, "args": _args(c)}} for c in result.tool_calls]
    if reasoning and parts:
        calls = [p for p in parts if "functionCall" in p]
        answer = [p for p in parts if not p.get("thought")]
        (calls or answer or parts)[0]["thoughtSignature"] = _signature(reasoning)
    return parts


def _pieces(text: str, size: int | None) -> list[str]:
    if not text:
        return []
    return [text] if size is None else [text[i : i + size] for i in range(0, len(text), size)]


def _args(call: ToolCall) -> dict[str, Any]:
    args = call.arguments_obj()
    return args if isinstance(args, dict) else {"_raw": call.arguments}  # args is a Struct on the wire


def _chunks(request: ChatRequest, result: ChatResult, parts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One chunk per text piece, all function calls together, finishReason on the last chunk.

    A turn with no parts at all still ends with one chunk that carries the finishReason (Gemini
    CLI retries a stream that has none). polar does not invent text for an empty answer, so
    Gemini CLI will still report such a turn as NO_RESPONSE_TEXT and retry it.
    """
    groups = [[p] for p in parts if "functionCall" not in p]
    calls = [p for p in parts if "functionCall" in p]
    if calls or not groups:
        groups.append(calls)
    last = len(groups) - 1
    return [_response(request, result, group, final=i == last) for i, group in enumerate(groups)]


def _response(request: ChatRequest, result: ChatResult, parts: list[dict[str, Any]], final: bool) -> dict[str, Any]:
    content: dict[str, Any] = {"role": "model"}
    if parts:  # the real API leaves out `parts` rather than sending an empty list
        content["parts"] = parts
    candidate: dict[str, Any] = {"content": content}
    if final:
        candidate["finishReason"] = _FINISH[result.finish_reason]
    candidate["index"] = 0
    return {
        "candidates": [candidate],
        "usageMetadata": _usage(result, final),
        "modelVersion": request.model,
        "responseId": result.id,
    }


def _usage(result: ChatResult, final: bool) -> dict[str, Any]:
    """Cumulative usage. Output counts are known per turn, not per piece, so they arrive last."""
    u = result.usage
    usage: dict[str, Any] = {"promptTokenCount": u.prompt_tokens}
    if final:
        # Gemini counts thoughts apart from candidates; canonical completion tokens include them.
        usage["candidatesTokenCount"] = max(0, u.completion_tokens - u.reasoning_tokens)
    usage["totalTokenCount"] = u.total_tokens if final else u.prompt_tokens
    if u.cached_tokens:
        usage["cachedContentTokenCount"] = u.cached_tokens
    if final and u.reasoning_tokens:
        usage["thoughtsTokenCount"] = u.reasoning_tokens
    usage["promptTokensDetails"] = [{"modality": "TEXT", "tokenCount": u.prompt_tokens}]
    return usage


def _envelope(route: Route, result: ChatResult, response: dict[str, Any]) -> dict[str, Any]:
    if getattr(route, "code_assist", False):
        return {"response": response, "traceId": result.id}
    return response
