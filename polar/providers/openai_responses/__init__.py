"""OpenAI Responses: `POST …/responses` ⇄ canonical request and result.

Routing: any POST whose path ends in `/responses` (OpenAI `/v1/responses`, a proxy-stripped
`/responses`, ChatGPT's `/backend-api/codex/responses` that Codex uses when logged in, Azure and
other prefixed hosts), and `…/responses/input_tokens` as the token-count endpoint.

How items become canonical messages:
- `instructions` is the first system message; system and developer items are system messages.
- One assistant turn arrives as several items (reasoning, message, function_call…). Consecutive
  assistant-side items merge into ONE assistant message, the shape chat templates expect. A new
  assistant message starts only where order would otherwise be lost: reasoning after content or
  calls, or text after calls.
- Reasoning text is recovered from `encrypted_content` when polar sealed it (Codex echoes only the
  blob and an empty summary), else from `content` reasoning_text, else from the summary. The blob
  is kept as `Reasoning.signature` so it round-trips; a blob polar cannot read (made by OpenAI)
  with no readable text becomes a redacted reasoning block.
- Custom (freeform) tools, such as Codex's `apply_patch`, become a canonical tool with a single
  string parameter `input` (the grammar, if any, is given in its description). Their calls travel
  canonically as arguments `{"input": <raw text>}` and are rendered back as `custom_tool_call`
  items carrying the raw text.
- `local_shell_call` history items become calls of a tool named `local_shell` whose arguments
  are the action object; hosted tools (web search, MCP, computer…) are not offered to the model
  and their items are skipped. Skipped tool and item types are listed in the parse's rewrites,
  so nothing disappears unseen.
- Server-side state polar does not keep (`conversation`, `background`, stored `prompt`s,
  `item_reference`) is refused with a clear message. `previous_response_id` becomes
  `ChatRequest.continues`, which the gateway resolves from the captures, polar's store.

`parse.py` reads requests, `render.py` writes Response objects and their event streams; what the
second needs from the first (echoed settings, `include`, custom tool names) is `ResponsesContext`.
"""

from __future__ import annotations

from typing import Any

from polar.canonical import ChatRequest, ChatResult
from polar.errors import GatewayError
from polar.providers.base import HttpReply, Parsed, Provider, Route, bare_path
from polar.providers.history import History
from polar.providers.openai_common import error_body, models_reply, openai_model_card
from polar.providers.openai_responses.parse import ResponsesContext, parse_request
from polar.providers.openai_responses.render import output_items, response_object
from polar.providers.openai_responses.stream import ResponsesStream
from polar.providers.stream import replay


class OpenAIResponses(Provider[ResponsesContext]):
    name = "openai_responses"

    def match(self, method: str, path: str, query: dict[str, str], headers: dict[str, str]) -> Route | None:
        if method.upper() != "POST":
            return None
        path = bare_path(path)
        if path.endswith("/responses"):
            return Route(self, "generate")
        if path.endswith("/responses/input_tokens"):
            return Route(self, "count_tokens")
        return None

    def parse(self, route: Route, body: Any, history: History | None = None) -> Parsed[ResponsesContext]:
        return parse_request(route, body, self.sealer, history)

    def render(self, route: Route, context: ResponsesContext, request: ChatRequest, result: ChatResult) -> HttpReply:
        if request.stream:
            return HttpReply.sse(replay(self.stream_renderer(route, context, request, result.id), result))
        output = output_items(context, request, result, self.sealer)
        return HttpReply.json(response_object(context, request, result.id, result, output))

    def stream_renderer(
        self, route: Route, context: ResponsesContext, request: ChatRequest, call_id: str
    ) -> ResponsesStream:
        return ResponsesStream(context, request, call_id, self.sealer)

    def render_count(self, route: Route, input_tokens: int) -> HttpReply:
        return HttpReply.json({"object": "response.input_tokens", "input_tokens": input_tokens})

    def error_body(self, error: GatewayError, status: int) -> tuple[dict, dict[str, str]]:
        return error_body(error), {}

    def model_card(self, name: str, window: int | None) -> dict[str, Any]:
        return openai_model_card(name, window)

    def render_models(self, models: list[str], window: int | None = None) -> HttpReply:
        return models_reply(models, window)


__all__ = ["OpenAIResponses", "ResponsesContext"]
