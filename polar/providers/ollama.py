"""Ollama's model-information probe, `POST /api/show`, answered in Ollama's own shape.

Ollama-aware clients ask whatever endpoint they are given for `/api/show` to learn a model's context
length before their first call (Hermes Agent does, when no context length is configured). polar speaks
no Ollama chat API; this answer is all such a client needs: the served model's window as
`model_info["<architecture>.context_length"]` (Ollama's key) and what the model can do. polar serves
every name it is asked for with its one model, so any name is shown.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from polar.errors import GatewayError
from polar.providers.base import HttpReply

SHOW_PATH = "/api/show"
# The model's own architecture is not known behind vLLM's API: this one names the keys that carry its numbers.
ARCHITECTURE = "polar"


def requested_model(body: Any) -> str:
    """The model a show request names (`model`, or `name` as older clients send it)."""
    name = body.get("model") or body.get("name") if isinstance(body, dict) else None
    if not isinstance(name, str) or not name:
        raise GatewayError("invalid_request", "model is required")
    return name


def show_reply(name: str, window: int | None, vision: bool = False) -> HttpReply:
    info: dict[str, Any] = {"general.architecture": ARCHITECTURE, "general.basename": name}
    if window:
        info[f"{ARCHITECTURE}.context_length"] = window
    details = {"parent_model": "", "format": "safetensors", "family": ARCHITECTURE, "families": [ARCHITECTURE],
               "parameter_size": "", "quantization_level": ""}
    return HttpReply.json({
        "modelfile": "", "parameters": "", "template": "", "details": details, "model_info": info,
        "capabilities": ["completion", "tools", *(["vision"] if vision else [])],
        "modified_at": datetime.now(UTC).isoformat(),
    })


def error_reply(error: GatewayError, status: int) -> HttpReply:
    """Ollama's error object: `{"error": message}`."""
    return HttpReply.json({"error": error.message}, status=status)
