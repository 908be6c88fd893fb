"""Opaque tokens that carry reasoning across turns through the client.

Providers ask clients to echo reasoning back: Anthropic `signature`, Gemini `thoughtSignature`,
Responses `encrypted_content`. vLLM has none of these, so polar mints them. `sign` is a MAC of
the reasoning text (the client sends the text beside it); `seal` embeds the text itself, for
formats where the client may send only the opaque blob (Codex sends reasoning items with
`encrypted_content` and an empty summary). This is an integrity check against mangling and
forgery, not secrecy: the reasoning is the model's own output and the harness already saw it.
The key is random per capture database (`CaptureWriter.seal_key`, kept in its `meta` table), never a default in the source.
"""

from __future__ import annotations

import base64
import hashlib
import hmac

_PREFIX = "polar1"


class Sealer:
    def __init__(self, key: bytes):
        if len(key) < 16:
            raise ValueError("a seal key needs at least 16 bytes")
        self._key = key

    def _mac(self, data: bytes) -> str:
        return base64.urlsafe_b64encode(hmac.new(self._key, data, hashlib.sha256).digest()[:18]).decode().rstrip("=")

    def sign(self, text: str) -> str:
        return f"{_PREFIX}.{self._mac(text.encode())}"

    def verify(self, text: str, signature: str | None) -> bool:
        return bool(signature) and hmac.compare_digest(self.sign(text), signature)

    def seal(self, text: str) -> str:
        raw = text.encode()
        body = base64.urlsafe_b64encode(raw).decode().rstrip("=")
        return f"{_PREFIX}.{body}.{self._mac(raw)}"

    def unseal(self, token: str | None) -> str | None:
        """The text inside a token made by `seal`, or None when it is not one of ours or was altered."""
        if not token or not token.startswith(_PREFIX + "."):
            return None
        try:
            _, body, mac = token.split(".")
            raw = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))
        except ValueError:
            return None
        return raw.decode() if hmac.compare_digest(self._mac(raw), mac) else None
