"""Opaque tokens that carry reasoning across turns through the client.

Providers ask clients to echo reasoning back: Anthropic `signature`, Gemini `thoughtSignature`,
Responses `encrypted_content`. vLLM has none of these, so polar mints them. `sign` is a MAC of
the reasoning text (the client sends the text beside it); `seal` embeds the text itself, for
formats where the client may send only the opaque blob (Codex sends reasoning items with
`encrypted_content` and an empty summary). This is an integrity check against mangling, not
secrecy: the reasoning is the model's own output and the harness already saw it.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os

_KEY = os.environ.get("POLAR_SIGNING_KEY", "polar-reasoning-seal-v1").encode()
_PREFIX = "polar1"


def _mac(data: bytes) -> str:
    return base64.urlsafe_b64encode(hmac.new(_KEY, data, hashlib.sha256).digest()[:18]).decode().rstrip("=")


def sign(text: str) -> str:
    return f"{_PREFIX}.{_mac(text.encode())}"


def verify(text: str, signature: str | None) -> bool:
    return bool(signature) and hmac.compare_digest(sign(text), signature)


def seal(text: str) -> str:
    raw = text.encode()
    body = base64.urlsafe_b64encode(raw).decode().rstrip("=")
    return f"{_PREFIX}.{body}.{_mac(raw)}"


def unseal(token: str | None) -> str | None:
    """The text inside a token made by `seal`, or None when it is not one of ours or was altered."""
    if not token or not token.startswith(_PREFIX + "."):
        return None
    try:
        _, body, mac = token.split(".")
        raw = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))
    except ValueError:
        return None
    return raw.decode() if hmac.compare_digest(_mac(raw), mac) else None
