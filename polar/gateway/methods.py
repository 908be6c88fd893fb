"""Which HTTP methods a path takes, and the answers that follow from it (405, OPTIONS, HEAD).

Model endpoints and Ollama's `/api/show` probe take POST; polar's own side paths (`/`, `…/models`,
`…/models/{id}`) take GET. HEAD is answered
as GET without the body: a keep-alive client reads headers only, so a body there would be read
as the start of the next response on that connection.
"""

from __future__ import annotations

from dataclasses import replace

from polar.errors import GatewayError
from polar.gateway.probes import probe_path, show_path
from polar.providers import HttpReply, ProviderSet, Route

MODEL_METHODS = "POST, OPTIONS"
SIDE_METHODS = "GET, HEAD, OPTIONS"


def allowed(route: Route | None, path: str) -> str | None:
    """The `Allow` value for a path polar serves, None for a path it does not know. `route`: the model endpoint a
    POST to this path would reach (providers only route POSTs)."""
    if route is not None or show_path(path):
        return MODEL_METHODS
    if path in ("/", "") or probe_path(path):
        return SIDE_METHODS
    return None


def method_reply(providers: ProviderSet, method: str, path: str, allow: str, headers: dict[str, str]) -> HttpReply | None:
    """204 to OPTIONS, 405 (in the caller's provider shape) to a method the path does not take, else None."""
    if method == "OPTIONS":
        return HttpReply(204, b"", {"allow": allow})
    if method in allow.split(", "):
        return None
    err = GatewayError("invalid_request", f"method {method} is not allowed on {path}; allowed: {allow}", status=405)
    reply = providers.guess(path, headers).render_error(err)
    reply.headers["allow"] = allow
    return reply


def headers_only(reply: HttpReply) -> HttpReply:
    """The reply to HEAD: GET's status and headers, its length announced, no body."""
    return replace(reply, body=b"", headers={**reply.headers, "content-length": str(len(reply.body))})
