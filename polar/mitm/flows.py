"""mitmproxy flows to the gateway's requests and back: headers read in one pass, answers built at once, and the
flow's comment mitmweb lists."""

from __future__ import annotations

import time

from mitmproxy import http
from mitmproxy.net.http import status_codes

from polar.providers.base import HttpReply
from polar.sessions.identity import IDENTITY_HEADERS


def gateway_headers(headers: http.Headers) -> dict[str, str]:
    """The request's headers by lower-case name, in one pass over the lines (mitmproxy's `items()` scans
    every line once per name). A repeated header is joined (HTTP's list rule), except the ones that name a
    session: of those the last line counts, as in the `--workers` front (haproxy's fhdr)."""
    joined: dict[str, str] = {}
    for raw_name, raw_value in headers.fields:
        name = raw_name.decode("utf-8", "surrogateescape").lower()  # as mitmproxy decodes them
        value = raw_value.decode("utf-8", "surrogateescape")
        if name in joined and name not in IDENTITY_HEADERS:
            value = f"{joined[name]}, {value}"
        joined[name] = value
    return joined


def flow_response(reply: HttpReply) -> http.Response:
    """The gateway's reply as mitmproxy's response, its headers encoded once (`Response.make` encodes them, then
    looks the length up among them again). Its length is the body's, unless the reply names one — a HEAD answer
    announces GET's — or it is a 204, which has none (RFC 9110)."""
    fields = [(k.encode("utf-8", "surrogateescape"), v.encode("utf-8", "surrogateescape")) for k, v in reply.headers.items()]
    if "content-length" not in reply.headers and reply.status != 204:
        fields.append((b"content-length", b"%d" % len(reply.body)))
    now = time.time()
    return http.Response(b"HTTP/1.1", reply.status, status_codes.RESPONSES.get(reply.status, "").encode(),
                         http.Headers(fields), reply.body, None, now, now)


def comment(flow: http.HTTPFlow) -> None:
    """The call's session, provider and token counts as the flow's comment, for mitmweb's list."""
    meta = flow.metadata.get("polar") or {}
    if "call_id" in meta:
        flow.comment = " ".join(
            f"{k}={meta[k]}" for k in ("session", "provider", "prompt_tokens", "completion_tokens") if k in meta
        )
