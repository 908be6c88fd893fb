"""Google Gemini `generateContent` / `streamGenerateContent` / `countTokens`.

Two front doors speak this format: the public API (`/v1beta/models/{model}:method`, used with an
API key by the google-genai SDKs and Gemini CLI) and Gemini CLI's "Login with Google" path, the
Code Assist service (`/v1internal:method`), which wraps the same request in
{"model", "project", "user_prompt_id", "request": {...}} and the same response in
{"response": {...}, "traceId"}. Both are parsed and rendered here; `GeminiRoute.code_assist`
remembers which envelope the client expects. `parse.py` and `config.py` read requests,
`render.py` writes responses; `GeminiContext` carries what the second needs from the first.

Field names: the real API is protobuf JSON, which accepts both lowerCamel and snake_case names,
and the Python SDK really does send some nested objects snake_case (`thinkingConfig`
arrives as {"include_thoughts": true, "thinking_budget": ...}); so every lookup tries both
(`fields.proto_names`).

Reasoning: Gemini CLI drops `thought: true` parts from its history and keeps only the
`thoughtSignature` of the other parts, so the signature polar mints *carries* the reasoning
(`Sealer.seal`) rather than just authenticating it. It is base64 of the sealed token,
because the Python SDK types `thoughtSignature` as bytes and rejects anything that is not base64.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, ClassVar
from urllib.parse import unquote

from polar.canonical import ChatRequest, ChatResult
from polar.errors import GatewayError
from polar.providers.base import HttpReply, Parsed, Provider, Route
from polar.providers.gemini.parse import GeminiContext, model_name, parse_request
from polar.providers.gemini.render import ERRORS, answer_parts, envelope_of, error_object, response
from polar.providers.gemini.stream import GeminiStream
from polar.providers.history import History
from polar.providers.stream import replay

_PUBLIC_PATH = re.compile(
    r"^/(?P<version>v1|v1beta|v1alpha)/(?P<model>[^:]+):(?P<method>generateContent|streamGenerateContent|countTokens)$"
)
_CODE_ASSIST_PATH = re.compile(r"^/v1internal:(?P<method>generateContent|streamGenerateContent|countTokens)$")

# Nominal limits for the model listing, where the upstream's context length is not known.
_INPUT_TOKEN_LIMIT = 1_048_576
_OUTPUT_TOKEN_LIMIT = 65_536


@dataclass
class GeminiRoute(Route):
    code_assist: bool = False  # Gemini CLI's /v1internal envelope on request and response


class GeminiGenerate(Provider[GeminiContext]):
    name = "gemini"
    statuses: ClassVar[dict[str, int]] = {kind: code for kind, (code, _) in ERRORS.items()}

    # ---- routing -------------------------------------------------------------------------

    def match(self, method: str, path: str, query: dict[str, str], headers: dict[str, str]) -> Route | None:
        if method.upper() != "POST":
            return None
        path = unquote(path.split("?", 1)[0])  # clients may send the colon as %3A
        if m := _CODE_ASSIST_PATH.match(path):
            return self._route(m["method"], None, query, code_assist=True)
        if m := _PUBLIC_PATH.match(path):
            return self._route(m["method"], model_name(m["model"]), query, code_assist=False)
        return None

    def _route(self, method: str, model: str | None, query: dict[str, str], code_assist: bool) -> GeminiRoute:
        endpoint = "count_tokens" if method == "countTokens" else "generate"
        stream = method == "streamGenerateContent"
        return GeminiRoute(self, endpoint, model, stream, dict(query), code_assist=code_assist)

    # ---- request -------------------------------------------------------------------------

    def parse(self, route: Route, body: Any, history: History | None = None) -> Parsed[GeminiContext]:
        return parse_request(route, body, self.sealer, history)

    # ---- responses -----------------------------------------------------------------------

    def render(self, route: Route, context: GeminiContext, request: ChatRequest, result: ChatResult) -> HttpReply:
        if route.stream:
            renderer = self.stream_renderer(route, context, request, result.id)
            return HttpReply(200, replay(renderer, result), {"content-type": renderer.content_type})
        answer = response(request, result, answer_parts(context, result, self.sealer))
        return HttpReply.json(envelope_of(_code_assist(route), result.id, answer))

    def stream_renderer(self, route: Route, context: GeminiContext, request: ChatRequest, call_id: str) -> GeminiStream:
        # without alt=sse the API streams one JSON array
        return GeminiStream(context, request, call_id, self.sealer, sse=route.query.get("alt") == "sse",
                            code_assist=_code_assist(route))

    def render_count(self, route: Route, input_tokens: int) -> HttpReply:
        details = [{"modality": "TEXT", "tokenCount": input_tokens}]
        return HttpReply.json({"totalTokens": input_tokens, "promptTokensDetails": details})

    def error_body(self, error: GatewayError, status: int) -> tuple[dict, dict[str, str]]:
        return {"error": error_object(error, status)}, {}

    def model_card(self, name: str, window: int | None) -> dict[str, Any]:
        return {
            "name": f"models/{model_name(name)}",
            "displayName": model_name(name),
            "supportedGenerationMethods": ["generateContent", "countTokens"],
            "inputTokenLimit": window or _INPUT_TOKEN_LIMIT,
            "outputTokenLimit": _OUTPUT_TOKEN_LIMIT,
        }

    def render_models(self, models: list[str], window: int | None = None) -> HttpReply:
        return HttpReply.json({"models": [self.model_card(m, window) for m in models]})

__all__ = ["GeminiContext", "GeminiGenerate", "GeminiRoute"]


def _code_assist(route: Route) -> bool:
    return getattr(route, "code_assist", False)
