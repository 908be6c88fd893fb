"""What harnesses ask besides model calls: model listings, one model's card, Ollama's `/api/show`.

These are answered from what polar knows of the served model (its names, the upstream's context
window), in the shape of the API asked, and leave no capture row: they are not model calls, and an
error row would read like a failed one. A harness that learns the context window here (Hermes Agent
reads `max_model_len` off `/v1/models`, or Ollama's `model_info`) sends no further probe.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import unquote

from polar.errors import GatewayError
from polar.gateway.body import decode_json
from polar.providers import HttpReply, Provider
from polar.providers.ollama import SHOW_PATH, error_reply, requested_model, show_reply

_MODELS = "/models"
_SHOW_STATUS = {"invalid_request": 400, "too_large": 413}


def listing_path(path: str) -> bool:
    """GET …/models: the listing every API has."""
    return path.rstrip("/").endswith(_MODELS)


def card_name(path: str) -> str | None:
    """The model a GET …/models/{id} asks about (ids may hold slashes; Gemini's hold no method)."""
    head, sep, name = path.partition(_MODELS + "/")
    name = unquote(name).rstrip("/")
    if not sep or not name or ":" in name or head.count("/") > 1:
        return None
    return name


def probe_path(path: str) -> bool:
    return listing_path(path) or card_name(path) is not None


def show_path(path: str) -> bool:
    return path.rstrip("/") == SHOW_PATH


@dataclass
class Served:
    """What a probe is told of the served model."""

    names: list[str]  # the served name first, then the configured aliases
    window: int | None  # the upstream's context length, when it says
    vision: bool = False


def answer_probe(provider: Provider, path: str, served: Served) -> HttpReply:
    """A listing or one model's card, in `provider`'s shape."""
    if listing_path(path):
        return provider.render_models(served.names, served.window)
    return provider.render_model(card_name(path) or "", served.window)


def answer_show(body: bytes, content_type: str | None, max_bytes: int, served: Served) -> HttpReply:
    """Ollama's `/api/show`: the named model's card, or Ollama's `{"error": …}` for a request it cannot read."""
    try:
        name = requested_model(decode_json(body, content_type, max_bytes))
    except GatewayError as err:
        return error_reply(err, err.status or _SHOW_STATUS.get(err.kind, 400))
    return show_reply(name, served.window, served.vision)
