"""OpenAI Chat Completions: `POST …/chat/completions` ⇄ canonical request and result.

Routing: any POST whose path ends in `/chat/completions`. That covers OpenAI's `/v1/…`, a
bare `/chat/completions` (base URL already ending in /v1 behind a proxy that strips it), and the
OpenAI-compatible endpoints other hosts serve under a prefix (`/api/v1`, `/compatible-mode/v1`,
`/v1beta/openai`, Azure deployments), which transparent capture meets without any client change.

Decisions:
- Legacy `functions` / `function_call` and the `function` role are refused with a clear message:
  none of the supported harnesses send them, and mapping them would need invented call ids.
- Custom (freeform) tools are refused: the Chat stream format has no delta shape for them.
- The answer carries reasoning twice, as `reasoning` (vLLM's current field) and
  `reasoning_content` (the older vLLM / DeepSeek name many harnesses still read). Clients
  pick one (`reasoning_content ?? reasoning`), so neither family loses the thinking text.
- `n` must be 1: polar samples one completion per call.
- `logprobs` requests are accepted but answered with `logprobs: null`; token-level data lives
  in the capture store, not in the client's response.
- Chat has no token-count endpoint, so `render_count` is never routed here.
- `chat_template_kwargs` (a vLLM extension) is read for `enable_thinking` only, which becomes the
  canonical thinking switch the upstream sends; other keys are listed in the rewrites.
"""

from __future__ import annotations

from typing import Any

from polar.canonical import ChatRequest, ChatResult
from polar.errors import GatewayError
from polar.providers.base import HttpReply, Parsed, Provider, Route, bare_path
from polar.providers.history import History
from polar.providers.openai_chat.parse import ChatContext, parse_request
from polar.providers.openai_chat.render import completion
from polar.providers.openai_chat.stream import ChatStream
from polar.providers.openai_common import error_body, models_reply, openai_model_card
from polar.providers.stream import replay


class OpenAIChat(Provider[ChatContext]):
    name = "openai_chat"

    def match(self, method: str, path: str, query: dict[str, str], headers: dict[str, str]) -> Route | None:
        if method.upper() == "POST" and bare_path(path).endswith("/chat/completions"):
            return Route(self, "generate")
        return None

    def parse(self, route: Route, body: Any, history: History | None = None) -> Parsed[ChatContext]:
        return parse_request(body, history)

    def render(self, route: Route, context: ChatContext, request: ChatRequest, result: ChatResult) -> HttpReply:
        if request.stream:
            return HttpReply.sse(replay(self.stream_renderer(route, context, request, result.id), result))
        return HttpReply.json(completion(request, result))

    def stream_renderer(self, route: Route, context: ChatContext, request: ChatRequest, call_id: str) -> ChatStream:
        return ChatStream(context, request, call_id)

    def render_count(self, route: Route, input_tokens: int) -> HttpReply:
        raise NotImplementedError("Chat Completions has no token-count endpoint")

    def error_body(self, error: GatewayError, status: int) -> tuple[dict, dict[str, str]]:
        return error_body(error), {}

    def model_card(self, name: str, window: int | None) -> dict[str, Any]:
        return openai_model_card(name, window)

    def render_models(self, models: list[str], window: int | None = None) -> HttpReply:
        return models_reply(models, window)


__all__ = ["ChatContext", "OpenAIChat"]
