"""Errors the gateway raises, in provider-neutral terms.

Each provider renders a `GatewayError` in its own error object and status code; the kind is
what decides both, so a new failure mode needs one new kind, not four new code paths.
"""

from __future__ import annotations

from typing import Literal

ErrorKind = Literal[
    "invalid_request",  # malformed JSON, wrong types, missing fields
    "not_found",  # unknown path or model
    "too_large",  # body over the configured limit
    "context_length",  # prompt + max tokens exceed the model's window
    "authentication",  # bad or missing credentials where they are required
    "permission",  # the caller is known but may not do this (e.g. act as another session)
    "rate_limit",
    "upstream_unavailable",  # upstream refused the connection / is down
    "upstream_timeout",
    "upstream_error",  # upstream answered 5xx or garbage
    "internal",  # a bug in polar: still answered in the provider's shape
]

# The HTTP status polar answers with for each kind (providers may refine per their docs).
STATUS: dict[str, int] = {
    "invalid_request": 400,
    "authentication": 401,
    "permission": 403,
    "not_found": 404,
    "too_large": 413,
    "context_length": 400,
    "rate_limit": 429,
    "upstream_unavailable": 503,
    "upstream_timeout": 504,
    "upstream_error": 502,
    "internal": 500,
}


class GatewayError(Exception):
    def __init__(self, kind: ErrorKind, message: str, *, param: str | None = None, status: int | None = None):
        super().__init__(message)
        self.kind: ErrorKind = kind
        self.message = message
        self.param = param
        self.status = status if status is not None else STATUS[kind]

    def __repr__(self) -> str:
        return f"GatewayError({self.kind!r}, {self.message!r})"


def invalid(message: str, param: str | None = None) -> GatewayError:
    return GatewayError("invalid_request", message, param=param)


def require(body: dict, key: str, typ: type | tuple[type, ...], where: str = "") -> object:
    """Fetch a required field from a request body with a message that names it on failure."""
    name = f"{where}{key}"
    if not isinstance(body, dict):
        raise invalid(f"{where or 'request body'} must be a JSON object")
    if key not in body or body[key] is None:
        raise invalid(f"missing required field '{name}'", name)
    value = body[key]
    if not isinstance(value, typ) or (isinstance(value, bool) and bool not in _as_tuple(typ)):
        raise invalid(f"field '{name}' must be {_type_name(typ)}, got {_json_type(value)}", name)
    return value


def optional(body: dict, key: str, typ: type | tuple[type, ...], where: str = "", default=None):
    """Like `require` but absent/null gives `default`."""
    if not isinstance(body, dict) or body.get(key) is None:
        return default
    return require(body, key, typ, where)


def _as_tuple(typ) -> tuple:
    return typ if isinstance(typ, tuple) else (typ,)


def _type_name(typ) -> str:
    names = {str: "a string", int: "an integer", float: "a number", bool: "a boolean", list: "an array", dict: "an object"}
    return " or ".join(names.get(t, t.__name__) for t in _as_tuple(typ))


def _json_type(value) -> str:
    if value is None:
        return "null"
    return {bool: "boolean", int: "integer", float: "number", str: "string", list: "array", dict: "object"}.get(
        type(value), type(value).__name__
    )
