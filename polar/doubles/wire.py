"""vLLM's wire shapes the double answers with: validation errors, error bodies, usage, faults.

Kept apart from the endpoints so each reads as "what vLLM does", and so
tests/integration/test_double_vs_vllm.py has one place to compare against the real server.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.responses import JSONResponse, Response


class Invalid(Exception):
    """A request vLLM would refuse; carries the error response it would send."""

    def __init__(self, response: Response):
        self.response = response


def field(body: dict[str, Any], name: str, typ: type, kind: str, msg: str) -> Any:
    value = body.get(name)
    if value is None:
        raise Invalid(validation(f"body.{name}", "missing", "Field required"))
    if not isinstance(value, typ):
        raise Invalid(validation(f"body.{name}", kind, msg))
    return value


def max_tokens(body: dict[str, Any], where: str = "body") -> int | None:
    value = body.get("max_tokens", body.get("max_completion_tokens"))
    if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
        raise Invalid(validation(f"{where}.max_tokens", "int_parsing", "Input should be a valid integer"))
    return value


def stream_options(body: dict[str, Any]) -> None:
    """vLLM's chat and completions requests take `stream_options` only with `stream: true`."""
    if body.get("stream_options") is not None and not body.get("stream"):
        raise Invalid(error(400, "Stream options can only be defined when `stream=True`. (parameter=stream_options)",
                            param="stream_options"))


def usage(prompt_len: int, completion_len: int) -> dict[str, Any]:
    return {"prompt_tokens": prompt_len, "total_tokens": prompt_len + completion_len,
            "completion_tokens": completion_len, "prompt_tokens_details": None}


def template_messages(messages: list[dict]) -> list[dict]:
    """As vLLM does before templating: tool-call arguments JSON text → objects."""
    out = []
    for m in messages:
        m = dict(m)
        if m.get("tool_calls"):
            calls = []
            for tc in m["tool_calls"]:
                fn = dict(tc.get("function", {}))
                if isinstance(fn.get("arguments"), str):
                    try:
                        fn["arguments"] = json.loads(fn["arguments"]) if fn["arguments"].strip() else {}
                    except json.JSONDecodeError:
                        pass
                calls.append({**tc, "function": fn})
            m["tool_calls"] = calls
        out.append(m)
    return out


class ResetMidBody(Response):
    """Announces a body, sends part of it, then breaks the connection (a reset mid-body)."""

    async def __call__(self, scope, receive, send) -> None:
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", b"4096")]})
        await send({"type": "http.response.body", "body": b'{"id": "chatcmpl-', "more_body": True})
        raise ConnectionResetError("scripted reset mid-body")


def error(status: int, message: str, typ: str = "BadRequestError", param: str | None = None) -> Response:
    return JSONResponse({"error": {"message": message, "type": typ, "param": param, "code": status}}, status_code=status)


def validation(loc: str, kind: str, msg: str) -> Response:
    """vLLM's answer to a body its request model rejects: pydantic's error, `param` naming the field."""
    return error(400, f"1 validation error:\n  {{'type': '{kind}', 'loc': '{loc}', 'msg': '{msg}'}}", "Bad Request", loc)


def too_few(max_tokens: int) -> Response:
    return error(400, f"max_tokens must be at least 1, got {max_tokens}. (parameter=max_tokens, value={max_tokens})",
                  param="max_tokens")
