"""Which session a call belongs to, and keeping the harness's secret out of storage and upstream.

Resolution order, most explicit first:
  1. an `x-polar-session` header (set by a runtime or a test client);
  2. a path prefix `/s/<session>/…` (reverse / base-URL mode: the base URL names the session);
  3. the API key: a key registered for a session maps to it; any other key maps to a session
     named after its salted hash, so one harness with its own key stays one session;
  4. the client address (a container's IP in transparent mode), registered or not.

Names are read from the header's bytes as they came, the last line of a repeated header, trimmed of
ASCII whitespace; the front of `--workers` (supervise/front.py) derives its affinity key by the same
rules, so two spellings polar takes for one session always reach one worker.

A registered key or address *binds* its client to a session: a runtime registered it, so it is
the truth. A harness that names another session by header or path is refused (`Identity.refused`),
so one session can neither write into nor continue another's captures.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import threading
from dataclasses import dataclass

SESSION_HEADER = "x-polar-session"
SESSION_ID = r"[A-Za-z0-9._:-]{1,128}"  # a session name as a `/s/<id>/` prefix carries it
_NOT_IN_ID = re.compile(rb"[^A-Za-z0-9._:-]")  # in a header's name: each such byte becomes "_"
ASCII_SPACE = " \t\n\r\v\f"  # what mitmproxy trims from a header value, and PCRE's [[:space:]]
_PATH_PREFIX = re.compile(rf"^/s/({SESSION_ID})(/.*)?$")
KEY_HEADERS = ("x-api-key", "x-goog-api-key", "api-key")  # a provider's API key, before `authorization`
IDENTITY_HEADERS = (SESSION_HEADER, *KEY_HEADERS, "authorization")  # a repeated one counts by its last line
# Headers that carry client credentials: read for identification, never stored or forwarded.
REDACTED = "<redacted>"
SECRET_HEADERS = ("authorization", "x-api-key", "x-goog-api-key", "api-key", "proxy-authorization", "cookie")


@dataclass(frozen=True)
class Identity:
    session: str
    path: str  # the request path with any session prefix removed
    key_hash: str | None  # salted hash of the client's key, for audit; never the key
    source: str  # header | path | key | address
    refused: str | None = None  # a session the request named but its bound client may not act as


HASHES_KEPT = 4096  # key hashes remembered (an HMAC a call otherwise)


class SessionRegistry:
    """Maps per-session API keys and client addresses to session ids, and holds what a runtime says of how its
    harness treats its history (`dropped_messages`, over the gateway's option), all filled by runtimes."""

    def __init__(self, salt: bytes | None = None):
        self._salt = salt or os.environ.get("POLAR_KEY_SALT", "").encode() or os.urandom(16)
        self._by_key: dict[str, str] = {}
        self._keys: dict[str, str] = {}  # key → session, in memory only: to re-hash under a new salt
        self._by_addr: dict[str, str] = {}
        self._dropped: dict[str, str] = {}  # session → splice | keep (config/options.py polar_dropped_messages)
        self._lock = threading.Lock()
        self._hashes: dict[str, str] = {}  # key → its hash under the current salt: a session sends one key every call

    def hash_key(self, key: str) -> str:
        if (known := self._hashes.get(key)) is not None:
            return known
        digest = hmac.new(self._salt, key.encode("utf-8", "surrogateescape"), hashlib.sha256).hexdigest()[:32]
        if len(self._hashes) >= HASHES_KEPT:  # keys are per session: the memo holds the recent ones
            self._hashes.clear()
        self._hashes[key] = digest
        return digest

    def register_key(self, key: str, session: str) -> None:
        with self._lock:
            self._by_key[self.hash_key(key)] = session
            self._keys[key] = session

    def resalt(self, salt: bytes) -> None:
        """A new capture database brings its own salt: registered keys are re-hashed under it."""
        with self._lock:
            self._salt, self._hashes = salt, {}
            self._by_key = {self.hash_key(k): s for k, s in self._keys.items()}

    def register_address(self, address: str, session: str) -> None:
        with self._lock:
            self._by_addr[address] = session

    def forget_address(self, address: str) -> None:
        with self._lock:
            self._by_addr.pop(address, None)

    def forget_key(self, key: str) -> None:
        with self._lock:
            self._by_key.pop(self.hash_key(key), None)
            if (session := self._keys.pop(key, None)) is not None:
                self._dropped.pop(session, None)

    def set_dropped_messages(self, session: str, policy: str) -> None:
        """How this session's harness drops messages is handled: splice | keep (forgotten with its key)."""
        if policy not in ("splice", "keep"):
            raise ValueError(f"dropped_messages is splice or keep, not {policy!r}")
        with self._lock:
            self._dropped[session] = policy

    def dropped_messages(self, session: str) -> str | None:
        return self._dropped.get(session)

    def resolve(self, path: str, headers: dict[str, str], client_addr: str | None) -> Identity:
        key = client_key(headers)
        key_hash = self.hash_key(key) if key else None
        bound = self._bound(key_hash, client_addr)
        claimed, path = _claim(path, headers)
        if claimed:
            if bound and bound[0] != claimed[0]:
                return Identity(bound[0], path, key_hash, bound[1], refused=claimed[0])
            return Identity(claimed[0], path, key_hash, claimed[1])
        if bound:
            return Identity(bound[0], path, key_hash, bound[1])
        if key_hash:
            return Identity(f"key-{key_hash[:16]}", path, key_hash, "key")
        return Identity(f"addr-{client_addr or 'unknown'}", path, key_hash, "address")


    def _bound(self, key_hash: str | None, client_addr: str | None) -> tuple[str, str] | None:
        """The session a runtime registered this client's key or address for, and which of the two."""
        if key_hash and key_hash in self._by_key:
            return self._by_key[key_hash], "key"
        if client_addr and client_addr in self._by_addr:
            return self._by_addr[client_addr], "address"
        return None


def _claim(path: str, headers: dict[str, str]) -> tuple[tuple[str, str] | None, str]:
    """The session a request names itself (header, else path prefix), and the path without the prefix."""
    m = _PATH_PREFIX.match(path)
    stripped = (m.group(2) or "/") if m else path
    if named := _clean(headers.get(SESSION_HEADER, "")):
        return (named, "header"), stripped
    if m:
        return (m.group(1), "path"), stripped
    return None, stripped


def client_key(headers: dict[str, str]) -> str | None:
    """The credential a client sent, whichever header its provider uses."""
    for name in KEY_HEADERS:
        if key := headers.get(name, "").strip(ASCII_SPACE):
            return key
    auth = headers.get("authorization", "").strip(ASCII_SPACE)
    if auth[:7].isascii() and auth[:7].lower() == "bearer ":
        return auth[7:].lstrip(ASCII_SPACE) or None
    return auth or None


def redact(headers: dict[str, str]) -> dict[str, str]:
    """Headers safe to store: credentials replaced by a marker."""
    return {k: (REDACTED if k.lower() in SECRET_HEADERS else v) for k, v in headers.items()}


def _clean(session: str) -> str:
    """A header's session name: byte by byte (mitmproxy's str holds the bytes surrogate-escaped), as haproxy sees it."""
    raw = session.strip(ASCII_SPACE).encode("utf-8", "surrogateescape")
    return _NOT_IN_ID.sub(b"_", raw)[:128].decode("ascii")
