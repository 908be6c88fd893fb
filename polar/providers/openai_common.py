"""What the two OpenAI wire formats (Chat Completions and Responses) share.

Both answer errors with the same `{"error": {...}}` object, list models the same way, accept
images as data/http URLs, and take `reasoning effort` and tool choices in close-enough shapes;
keeping these here means the two providers cannot drift apart on them.
"""

from __future__ import annotations

from typing import Any

from polar.canonical import ImagePart, Thinking, ToolChoice
from polar.errors import GatewayError
from polar.providers.base import HttpReply, now
from polar.providers.fields import expect, invalid
from polar.providers.stream import pieces

# kind -> (error.type, error.code) as OpenAI's own API reports them.
_ERROR_SHAPES: dict[str, tuple[str, str | None]] = {
    "invalid_request": ("invalid_request_error", None),
    "not_found": ("invalid_request_error", None),
    "too_large": ("invalid_request_error", None),
    "context_length": ("invalid_request_error", "context_length_exceeded"),
    "authentication": ("invalid_request_error", "invalid_api_key"),
    "permission": ("invalid_request_error", "permission_denied"),
    "rate_limit": ("requests", "rate_limit_exceeded"),
    "upstream_unavailable": ("server_error", None),
    "upstream_timeout": ("server_error", "timeout"),
    "upstream_error": ("server_error", None),
    "internal": ("server_error", None),
    "stopping": ("server_error", None),
}

# Longest streamed delta: a few tokens' worth, as OpenAI streams about a token per delta.
_PIECE_MAX = 16


def error_body(error: GatewayError) -> dict[str, Any]:
    etype, code = _ERROR_SHAPES.get(error.kind, ("server_error", None))
    return {"error": {"message": error.message, "type": etype, "param": error.param, "code": code}}


def openai_model_card(name: str, window: int | None) -> dict[str, Any]:
    """OpenAI's model object; `max_model_len` as vLLM adds it, which clients read as the context window."""
    card: dict[str, Any] = {"id": name, "object": "model", "created": now(), "owned_by": "polar"}
    if window:
        card["max_model_len"] = window
    return card


def models_reply(models: list[str], window: int | None = None) -> HttpReply:
    return HttpReply.json({"object": "list", "data": [openai_model_card(m, window) for m in models]})


def deltas(text: str) -> list[str]:
    """Text cut into deltas the way both OpenAI APIs stream it."""
    return pieces(text, _PIECE_MAX)


def image_from_url(url: Any, where: str) -> ImagePart:
    """An image given as `data:<type>;base64,<data>` (kept inline) or as a URL to fetch."""
    url = expect(url, str, where)
    if not url.startswith("data:"):
        return ImagePart(url=url)
    header, sep, data = url[len("data:") :].partition(",")
    media_type, *params = header.split(";")
    if not sep or "base64" not in params:
        raise invalid(f"'{where}' must be a base64 data URL or an http(s) URL", where)
    return ImagePart(media_type=media_type or None, data=data)


def thinking_from_effort(effort: Any, where: str) -> Thinking:
    """OpenAI reasoning effort: "none" switches thinking off, any other level switches it on."""
    effort = expect(effort, str, where)
    return Thinking(enabled=effort != "none", effort=effort)


def tool_choice(value: Any, where: str = "tool_choice") -> ToolChoice:
    """Both APIs' tool_choice shapes.

    Chat nests the name (`{"type":"function","function":{"name":..}}`), Responses does not
    (`{"type":"function","name":..}`). `allowed_tools` keeps only its mode: the canonical request
    cannot restrict the tool list without changing the prompt. Choices naming a hosted tool
    (web search, MCP…) fall back to "auto" because those tools are not offered to the model.
    """
    if value is None:
        return ToolChoice()
    if isinstance(value, str):
        if value not in ("auto", "none", "required"):
            raise invalid(f"'{where}' must be one of 'auto', 'none', 'required' or an object", where)
        return ToolChoice(mode=value)
    choice = expect(value, dict, where)
    kind = expect(choice.get("type"), str, f"{where}.type")
    if kind in ("function", "custom"):
        nested = choice.get(kind)
        name = nested.get("name") if isinstance(nested, dict) else choice.get("name")
        return ToolChoice(mode="tool", name=expect(name, str, f"{where}.name"))
    if kind == "allowed_tools":
        nested = choice.get("allowed_tools")
        mode = (nested if isinstance(nested, dict) else choice).get("mode", "auto")
        if mode not in ("auto", "required"):
            raise invalid(f"'{where}.mode' must be 'auto' or 'required'", f"{where}.mode")
        return ToolChoice(mode=mode)
    return ToolChoice()


def json_schema_format(fmt: Any, where: str, nested: str | None = None) -> dict[str, Any] | None:
    """A JSON output format → the schema to follow (None for plain text).

    Chat nests the schema under `json_schema` (`nested="json_schema"`); Responses' `text.format`
    holds it directly.
    """
    fmt = expect(fmt, dict, where)
    kind = fmt.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "object"}
    if kind == "json_schema":
        path = f"{where}.{nested}" if nested else where
        holder = expect(fmt.get(nested), dict, path) if nested else fmt
        return expect(holder.get("schema"), dict, f"{path}.schema")
    raise invalid(f"'{where}.type' must be 'text', 'json_object' or 'json_schema'", f"{where}.type")
