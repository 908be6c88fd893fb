"""Errors the gateway raises, in provider-neutral terms.

Each provider renders a `GatewayError` in its own error object and status code; the kind is
what decides both, so a new failure mode needs one new kind, not four new code paths. Request
validation helpers live in `polar.providers.fields`.
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
    "stopping",  # polar itself is shutting down (SIGTERM): retry, another process or the restarted one serves it
]

# The HTTP status polar answers with for each kind (a provider may map kinds per its own docs).
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
    "stopping": 503,
}


class GatewayError(Exception):
    def __init__(self, kind: ErrorKind, message: str, *, param: str | None = None, status: int | None = None):
        super().__init__(message)
        self.kind: ErrorKind = kind
        self.message = message
        self.param = param
        # A status the raiser chose on purpose (e.g. 426); None lets the provider map the kind.
        self.status = status
        # The fleet replica the failure came from (polar/upstream/fleet), for the capture row.
        self.replica: str | None = None

    def __repr__(self) -> str:
        return f"GatewayError({self.kind!r}, {self.message!r})"
