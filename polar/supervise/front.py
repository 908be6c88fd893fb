"""The front of `polar proxy --workers N`: an haproxy config that sends every call of a session to one worker.

The affinity key is the session key polar itself resolves (sessions/identity.py), in the same order
and spelt by the same rules: the `x-polar-session` header (its last line, trimmed, each byte outside
the id alphabet made "_", 128 bytes), the `/s/<id>/` path prefix, the API key (whichever header its
provider uses; `authorization` without its "Bearer "), the client address. A header that trims to
nothing names nothing, as in polar. haproxy hashes the key consistently onto the workers, and never re-balances: no
health checks, so a session is never moved to a worker that lacks its state (the supervisor stops the
whole front when a worker dies). The client's address travels to the worker in CLIENT_ADDR_HEADER,
which the front always overwrites, so a client cannot choose the address its session is named by.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence

from polar.sessions.identity import KEY_HEADERS, SESSION_HEADER, SESSION_ID

CLIENT_ADDR_HEADER = "x-polar-client-addr"
# The same id polar accepts in a `/s/<id>/` prefix; any other path falls through to the key, as in polar.
_PATH_SESSION = rf"^/s/{SESSION_ID}(/|$)"
# identity.py's spelling of a name, as haproxy converters (PCRE, byte by byte; single quotes: no $ expansion).
_TRIM = "regsub('^[[:space:]]+|[[:space:]]+$','',g)"  # [[:space:]] is identity.ASCII_SPACE
_ID_BYTES = "regsub('[^A-Za-z0-9._:-]','_',g),bytes(0,128)"
_BEARER = "regsub('^[Bb][Ee][Aa][Rr][Ee][Rr] [[:space:]]*','')"
# Errors the front itself answers, in a JSON shape the OpenAI and Anthropic SDKs both read.
_FRONT_ERRORS = {
    400: "the request is malformed or its headers are too large",
    408: "the request did not arrive in time",
    502: "the polar worker for this session answered nothing valid",
    503: "the polar worker for this session is not available",
    504: "the polar worker for this session did not answer in time",
}


def haproxy_binary() -> str | None:
    return shutil.which("haproxy") or next(
        (p for p in ("/usr/sbin/haproxy", "/usr/local/sbin/haproxy") if shutil.which(p)), None)


def _error_body(message: str) -> str:
    return json.dumps({"type": "error", "error": {"type": "api_error", "message": message}}, separators=(",", ":"))


def _key_from(fetch: str, condition: str = "") -> tuple[str, str]:
    """Take the key from `fetch` (if still unset); a value that trims to nothing leaves it unset."""
    return (f"  http-request set-var(txn.polar_key) {fetch} {('if ' + condition) if condition else ''}".rstrip(),
            "  http-request unset-var(txn.polar_key) if { var(txn.polar_key) -m len 0 }")


def haproxy_config(host: str, port: int, workers: Sequence[int], timeout_s: int = 3600) -> str:
    """The whole config: one frontend on host:port, one backend with a server per worker port (loopback)."""
    key = "var(txn.polar_key)"
    unset = f"!{{ {key} -m found }}"
    lines = [
        "global",
        "  log stderr format short daemon warning",  # problems only, never a line per connection
        "  tune.bufsize 65536",  # headers up to ~60 KB (the default 16 KB refuses some agent requests)
        "",
        "defaults",
        "  mode http",
        "  log global",
        "  option dontlognull",
        # Streamed answers go out event by event: without it the kernel holds small writes (MSG_MORE) and
        # the client gets a burst every ~200 ms.
        "  option http-no-delay",
        "  timeout connect 5s",
        # Minutes-long generations, streamed or not: the upstream's own timeout ends them first.
        f"  timeout client {timeout_s}s",
        f"  timeout server {timeout_s}s",
        "  timeout http-request 300s",  # the whole request head (large bodies stream on to polar)
        "  timeout http-keep-alive 600s",
        *(f"  http-error status {code} content-type application/json string '{_error_body(msg)}'"
          for code, msg in _FRONT_ERRORS.items()),
        "",
        "frontend polar",
        f"  bind {host}:{port}",
        f"  http-request set-header {CLIENT_ADDR_HEADER} %[src]",
        *_key_from(f"req.fhdr({SESSION_HEADER}),{_TRIM},{_ID_BYTES}"),
        f"  http-request set-var(txn.polar_key) path,field(3,/) if {unset} {{ path_reg {_PATH_SESSION} }}",
        *(line for h in KEY_HEADERS for line in _key_from(f"req.fhdr({h}),{_TRIM}", unset)),
        *_key_from(f"req.fhdr(authorization),{_TRIM},{_BEARER}", unset),
        f"  http-request set-var(txn.polar_key) src if {unset}",
        "  default_backend workers",
        "",
        "backend workers",
        f"  balance hash {key}",
        "  hash-type consistent sdbm avalanche",  # avalanche: similar session names still spread
        # weight 100: more points per worker on the hash ring, an even split (weight 1: 56/44 over 1000 sessions).
        *(f"  server w{i} 127.0.0.1:{p} weight 100" for i, p in enumerate(workers)),
        "",
    ]
    return "\n".join(lines)
