"""What the four providers share: one status decision, detection, and seals keyed per capture database."""

from __future__ import annotations

import asyncio
import json

import pytest

from polar.canonical import ChatResult
from polar.capture.reader import CaptureReader
from polar.capture.writer import CaptureWriter
from polar.errors import STATUS, GatewayError
from polar.gateway.pipeline import Gateway, GatewayRequest
from polar.providers import NAMES, ProviderSet, Sealer
from tests.providers.support import PROVIDERS

# A request each provider would route, and how its error body carries the message.
ROUTES = {
    "anthropic": "/v1/messages",
    "openai_chat": "/v1/chat/completions",
    "openai_responses": "/v1/responses",
    "gemini": "/v1beta/models/m:generateContent",
}


@pytest.mark.parametrize("name", NAMES)
def test_a_chosen_status_wins_in_every_provider(name):
    """The WebSocket refusal is a 426 in all four shapes (Gemini used to answer it with 400)."""
    error = GatewayError("invalid_request", "WebSocket refused", status=426)
    reply = PROVIDERS.by_name[name].render_error(error)
    body = json.loads(reply.body)
    assert reply.status == 426 and body["error"]["message"] == "WebSocket refused"
    if name == "gemini":
        assert body["error"]["code"] == 426  # Google's code always equals the HTTP status


@pytest.mark.parametrize("name", NAMES)
def test_without_a_chosen_status_the_kind_decides(name):
    provider = PROVIDERS.by_name[name]
    for kind in STATUS:
        assert provider.render_error(GatewayError(kind, "x")).status == provider.statuses[kind]
    assert provider.render_error(GatewayError("upstream_unavailable", "x")).status == (
        529 if name == "anthropic" else 503
    )


@pytest.mark.parametrize("name", NAMES)
def test_detection_routes_each_format_to_its_provider(name):
    route = PROVIDERS.detect("POST", ROUTES[name], {}, {})
    assert route is not None and route.provider is PROVIDERS.by_name[name]
    assert PROVIDERS.detect("GET", ROUTES[name], {}, {}) is None


def test_guess_names_the_likely_provider():
    assert PROVIDERS.guess("/v1/models", {"anthropic-version": "2023-06-01"}).name == "anthropic"
    assert PROVIDERS.guess("/v1beta/models", {}).name == "gemini"
    assert PROVIDERS.guess("/v1/responses/x", {}).name == "openai_responses"
    assert PROVIDERS.guess("/v1/models", {}).name == "openai_chat"


def test_a_sealer_needs_a_real_key():
    with pytest.raises(ValueError):
        Sealer(b"")


def test_seal_keys_belong_to_their_capture_database(tmp_path):
    a, b = CaptureWriter(tmp_path / "a.db"), CaptureWriter(tmp_path / "b.db")
    try:
        key_a, key_b = a.seal_key, b.seal_key
        assert len(key_a) == 32 and key_a != key_b
        signed, sealed = Sealer(key_a).sign("thought"), Sealer(key_a).seal("thought")
        assert not Sealer(key_b).verify("thought", signed) and Sealer(key_b).unseal(sealed) is None
        # the gateway's providers use their database's key
        assert Gateway(a, backend=None).providers.sealer.verify("thought", signed)
    finally:
        a.close()
        b.close()
    reopened = CaptureWriter(tmp_path / "a.db")
    try:
        assert reopened.seal_key == key_a
        providers = ProviderSet(Sealer(reopened.seal_key))
        assert providers.sealer.verify("thought", signed) and providers.sealer.unseal(sealed) == "thought"
    finally:
        reopened.close()


class _Backend:
    """Test double for the upstream: one fixed answer, no tokens."""

    async def model(self) -> str:
        return "m"

    async def complete(self, request, call_id, session=None) -> ChatResult:
        return ChatResult(id=call_id, model="m", created=0, content="ok")

    async def count_tokens(self, request) -> int:
        return 1

    def template_traits(self):
        return None  # unknown: only leading system messages are merged


def test_the_gateway_records_what_the_parser_left_out(tmp_path):
    store = CaptureWriter(tmp_path / "c.db")
    try:
        gateway = Gateway(store, _Backend())
        body = {"model": "m", "input": "hi", "tools": [{"type": "web_search"}]}
        req = GatewayRequest("POST", "/v1/responses", {}, {"content-type": "application/json"}, json.dumps(body).encode())
        out = asyncio.run(gateway.handle(req))
        assert out.reply.status == 200
        (row,) = CaptureReader(store.path).calls(with_tokens=False)
        assert row["rewrites"] == ["hosted tool not offered to the model: web_search"]
    finally:
        store.close()


@pytest.mark.parametrize("name", NAMES)
def test_the_gateway_refuses_websocket_with_426_in_every_shape(tmp_path, name):
    store = CaptureWriter(tmp_path / "c.db")
    try:
        headers = {"upgrade": "websocket", "connection": "Upgrade"}
        out = asyncio.run(Gateway(store, _Backend()).handle(GatewayRequest("GET", ROUTES[name], {}, headers, b"")))
        body = json.loads(out.reply.body)
        assert out.reply.status == 426 and "websocket" in body["error"]["message"].lower()
    finally:
        store.close()
