"""Anthropic Messages request → canonical request."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from polar.canonical import (
    ChatRequest,
    ImagePart,
    Message,
    Part,
    Reasoning,
    Sampling,
    TextPart,
    Thinking,
    Tool,
    ToolCall,
    ToolChoice,
)
from polar.providers.base import Parsed, Route
from polar.providers.fields import (
    body_object,
    expect,
    invalid,
    optional,
    require,
    strings,
)
from polar.providers.history import History, MessageReader, read_history, read_part
from polar.providers.reasoning_seal import Sealer


@dataclass(frozen=True)
class AnthropicContext:
    thinking_display: str | None = None  # "summarized" or "omitted": how thinking goes back


# Blocks of Anthropic-hosted tools (web search, code execution, MCP connector, tool search).
# polar runs no server tools, so their traces in history carry nothing the model can use.
_SERVER_BLOCKS = {"server_tool_use", "mcp_tool_use", "mcp_tool_result", "container_upload", "tool_reference"}

# Claude Code opens its system prompt with an attribution line for Anthropic's billing
# ("x-anthropic-billing-header: cc_version=…; cc_prev_req=req_…; cch=…;"), which Anthropic's API
# takes out of the prompt. Its values change on every request: left in, every turn of a session
# would start with a different prefix, so no turn could continue the previous one's tokens.
_BILLING_MARK = "x-anthropic-billing-header:"
_BILLING_LINE = re.compile(r"^" + _BILLING_MARK + r"[^\n]*(?:\n|$)", re.MULTILINE)
_BILLING_NOTE = "Claude Code billing line removed from the system prompt"


def parse_request(route: Route, body: Any, sealer: Sealer, history: History | None = None) -> Parsed[AnthropicContext]:
    """`history`: the session's earlier reads of its messages, resumed where this request repeats them."""
    body = body_object(body)
    generate = route.endpoint == "generate"
    max_tokens = require(body, "max_tokens", int) if generate else optional(body, "max_tokens", int)
    if max_tokens is not None and max_tokens < 1:
        raise invalid("field 'max_tokens' must be at least 1", "max_tokens")
    reader = _Reader(sealer)
    raw_tools = optional(body, "tools", list, default=[])
    tools, notes = read_part(history, "tools", raw_tools, lambda: _tools(raw_tools))
    reader.rewrites += notes  # the tools' notes first, as they are read first
    choice, parallel = _parse_tool_choice(optional(body, "tool_choice", dict))
    effort, schema = _output_config(body.get("output_config"))
    thinking, display = _parse_thinking(optional(body, "thinking", dict), effort)
    model = require(body, "model", str)
    system = reader.system(body.get("system"), history)
    raw_messages = require(body, "messages", list)
    if not raw_messages:
        raise invalid("field 'messages' must contain at least one message", "messages")
    conversation = _Conversation(sealer)
    request = ChatRequest(
        model=model,
        messages=system + read_history(raw_messages, conversation, history),
        tools=tools,
        tool_choice=choice,
        parallel_tool_calls=parallel,
        sampling=Sampling(
            max_tokens=max_tokens,
            temperature=optional(body, "temperature", (int, float)),
            top_p=optional(body, "top_p", (int, float)),
            top_k=optional(body, "top_k", int),
            stop=strings(optional(body, "stop_sequences", list, default=[]), "stop_sequences"),
        ),
        thinking=thinking,
        stream=generate and optional(body, "stream", bool, default=False),
        response_schema=schema,
        metadata=optional(body, "metadata", dict, default={}),
    )
    rewrites = list(dict.fromkeys(reader.rewrites + conversation.notes))
    return Parsed(request, AnthropicContext(thinking_display=display), rewrites)


Block = tuple[dict, str]  # a content block and its path in the body, for error messages


def _blocks(content: str | list, where: str) -> list[Block]:
    """Content as a list of typed blocks; a plain string is one text block."""
    if isinstance(content, str):
        return [({"type": "text", "text": content}, where)]
    out = []
    for j, block in enumerate(content):
        path = f"{where}[{j}]"
        require(expect(block, dict, path), "type", str, f"{path}.")
        out.append((block, path))
    return out


def _text_parts(blocks: list[Block]) -> list[Part]:
    parts: list[Part] = []
    for block, path in blocks:
        if block["type"] != "text":
            raise invalid(f"'{path}' must be a text block, got type {block['type']!r}", f"{path}.type")
        parts.append(TextPart(text=require(block, "text", str, f"{path}.")))
    return parts


class _Reader:
    """Reads a request's system prompt, noting what it leaves out or changes (after the tools' notes)."""

    def __init__(self, sealer: Sealer):
        self.sealer = sealer
        self.rewrites: list[str] = []

    def system(self, system: Any, history: History | None) -> list[Message]:
        """The system message, the same object while the session's system blocks stay the same JSON (its
        fingerprint and stored form are then computed once). Claude Code's billing line, a block of its own
        that differs on every call, is left out before that comparison."""
        if system is None or system == "":
            return []
        expect(system, (str, list), "system")
        blocks = [(block, path) for block, path in _blocks(system, "system") if not self._billing_only(block)]
        messages, notes = read_part(history, "system", [block for block, _ in blocks], lambda: _system_message(blocks))
        self.rewrites += notes
        return messages

    def _billing_only(self, block: dict) -> bool:
        text = block.get("text")
        stripped = _without_billing(text) if block["type"] == "text" and isinstance(text, str) else None
        if stripped is None or stripped.strip():
            return False
        self.rewrites.append(_BILLING_NOTE)
        return True


def _without_billing(text: str) -> str | None:
    """The text without Claude Code's billing line; None when it holds none."""
    if _BILLING_MARK not in text:  # a substring test first: far cheaper than the regex over a long prompt
        return None
    stripped = _BILLING_LINE.sub("", text)
    return None if stripped == text else stripped


def _system_message(blocks: list[Block]) -> tuple[list[Message], list[str]]:
    parts, notes = [], []
    for part in _text_parts(blocks):
        stripped = _without_billing(part.text)
        if stripped is not None:
            notes.append(_BILLING_NOTE)
            if not stripped.strip():
                continue
            part = part.model_copy(update={"text": stripped})
        parts.append(part)
    return ([Message(role="system", content=parts)] if parts else []), notes


def _tools(raw: list) -> tuple[tuple[Tool, ...], list[str]]:
    """Custom tools, and a note for each Anthropic-hosted/typed tool, which polar cannot run and leaves out."""
    tools: list[Tool] = []
    notes: list[str] = []
    for k, item in enumerate(raw):
        where = f"tools[{k}]."
        kind = optional(expect(item, dict, f"tools[{k}]"), "type", str, where)
        if kind not in (None, "custom"):
            name = item.get("name") if isinstance(item.get("name"), str) else kind
            notes.append(f"server tool not offered to the model: {name}")
            continue
        tools.append(
            Tool(
                name=require(item, "name", str, where),
                description=optional(item, "description", str, where),
                parameters=require(item, "input_schema", dict, where),
            )
        )
    return tuple(tools), notes


class _Conversation(MessageReader):
    """Reads `messages` one by one into canonical messages, noting what it leaves out or changes."""

    def __init__(self, sealer: Sealer):
        super().__init__()
        self.sealer = sealer

    def _server_block(self, kind: str) -> bool:
        """Whether a block is a hosted tool's trace, which is left out (and noted)."""
        if kind in _SERVER_BLOCKS or kind.endswith("_tool_result"):
            self.notes.append(f"server tool block left out: {kind}")
            return True
        return False

    def read(self, index: int, item: Any) -> None:
        where = f"messages[{index}]"
        role = require(expect(item, dict, where), "role", str, f"{where}.")
        blocks = _blocks(require(item, "content", (str, list), f"{where}."), f"{where}.content")
        if role == "user":
            self.messages.extend(self._user_messages(blocks))
        elif role == "assistant":
            message = self._assistant_message(blocks)
            self.names.add(message)
            self.messages.append(message)
        elif role == "system":
            self.messages.append(Message(role="system", content=_text_parts(blocks)))
        else:
            message = f"field '{where}.role' must be 'user', 'assistant' or 'system', got {role!r}"
            raise invalid(message, f"{where}.role")

    def _user_messages(self, blocks: list[Block]) -> list[Message]:
        """Tool results become tool messages, in order; what is left follows as one user message."""
        results: list[Message] = []
        rest: list[Part] = []
        for block, path in blocks:
            kind = block["type"]
            if kind == "tool_result":
                results.append(self._tool_result(block, path))
            elif not self._server_block(kind):
                rest.extend(self._user_parts(block, path))
        if rest or not results:
            results.append(Message(role="user", content=rest))
        return results

    def _user_parts(self, block: dict, path: str) -> list[Part]:
        kind = block["type"]
        if kind == "text":
            return [TextPart(text=require(block, "text", str, f"{path}."))]
        if kind == "image":
            return [_image(block, path)]
        if kind == "document":
            return self._document(block, path)
        if kind == "search_result":
            return _text_parts(_blocks(require(block, "content", list, f"{path}."), f"{path}.content"))
        raise invalid(f"'{path}' has unsupported content block type {kind!r}", f"{path}.type")

    def _document(self, block: dict, path: str) -> list[Part]:
        where = f"{path}.source."
        source = require(block, "source", dict, f"{path}.")
        kind = require(source, "type", str, where)
        if kind == "text":
            return [TextPart(text=require(source, "data", str, where))]
        if kind == "content":
            content = require(source, "content", (str, list), where)
            return [p for b, p_path in _blocks(content, f"{where}content") for p in self._user_parts(b, p_path)]
        # PDFs and files cannot reach a text model. Failing would wedge a harness whose history holds
        # one forever, so the model is told a document was left out instead.
        media = optional(source, "media_type", str, where) or kind
        self.notes.append(f"document replaced by a note: {media}")
        return [TextPart(text=f"[document omitted: {media} documents are not supported]")]

    def _tool_result(self, block: dict, path: str) -> Message:
        call_id = require(block, "tool_use_id", str, f"{path}.")
        content = optional(block, "content", (str, list), f"{path}.", default="")
        parts: list[Part] = []
        for item, item_path in _blocks(content, f"{path}.content"):
            if not self._server_block(item["type"]):
                parts.extend(self._user_parts(item, item_path))
        return Message(
            role="tool",
            content=parts,
            tool_call_id=call_id,
            name=self.names.get(call_id),
            is_error=optional(block, "is_error", bool, f"{path}.", default=False),
        )

    def _assistant_message(self, blocks: list[Block]) -> Message:
        message = Message(role="assistant")
        for block, path in blocks:
            kind = block["type"]
            if kind == "text":
                message.content.append(TextPart(text=require(block, "text", str, f"{path}.")))
            elif kind == "thinking":
                message.reasoning.append(self._thinking_block(block, path))
            elif kind == "redacted_thinking":
                message.reasoning.append(Reasoning(text=require(block, "data", str, f"{path}."), redacted=True))
            elif kind == "tool_use":
                message.tool_calls.append(_tool_use(block, path))
            elif not self._server_block(kind):
                raise invalid(f"'{path}' has unsupported assistant content block type {kind!r}", f"{path}.type")
        return message

    def _thinking_block(self, block: dict, path: str) -> Reasoning:
        text = require(block, "thinking", str, f"{path}.")
        signature = optional(block, "signature", str, f"{path}.")
        # With display "omitted" the client saw no text; the signature polar minted carries it.
        if not text:
            text = self.sealer.unseal(signature) or ""
        return Reasoning(text=text, signature=signature)


def _image(block: dict, path: str) -> ImagePart:
    where = f"{path}.source."
    source = require(block, "source", dict, f"{path}.")
    kind = require(source, "type", str, where)
    if kind == "base64":
        return ImagePart(media_type=require(source, "media_type", str, where), data=require(source, "data", str, where))
    if kind == "url":
        return ImagePart(url=require(source, "url", str, where))
    raise invalid(f"field '{where}type' must be 'base64' or 'url', got {kind!r}", f"{where}type")


def _tool_use(block: dict, path: str) -> ToolCall:
    arguments = optional(block, "input", dict, f"{path}.", default={})
    # The client echoes a parsed object; re-serialise it the way chat templates' tojson does.
    return ToolCall(
        id=require(block, "id", str, f"{path}."),
        name=require(block, "name", str, f"{path}."),
        arguments=json.dumps(arguments, ensure_ascii=False),
    )


def _parse_tool_choice(raw: dict | None) -> tuple[ToolChoice, bool | None]:
    if raw is None:
        return ToolChoice(), None
    kind = require(raw, "type", str, "tool_choice.")
    modes = {"auto": "auto", "any": "required", "none": "none", "tool": "tool"}
    if kind not in modes:
        message = f"field 'tool_choice.type' must be one of auto, any, none, tool; got {kind!r}"
        raise invalid(message, "tool_choice.type")
    name = require(raw, "name", str, "tool_choice.") if kind == "tool" else None
    disable = optional(raw, "disable_parallel_tool_use", bool, "tool_choice.")
    return ToolChoice(mode=modes[kind], name=name), None if disable is None else not disable


def _parse_thinking(raw: dict | None, effort: str | None) -> tuple[Thinking, str | None]:
    """The thinking switch and the requested display ("summarized" / "omitted"), if any."""
    if raw is None:
        return Thinking(effort=effort), None
    kind = require(raw, "type", str, "thinking.")
    display = optional(raw, "display", str, "thinking.")
    if kind == "enabled":
        budget = require(raw, "budget_tokens", int, "thinking.")
        return Thinking(enabled=True, budget_tokens=budget, effort=effort), display
    if kind in ("adaptive", "between_tools"):
        return Thinking(enabled=True, effort=effort), display
    if kind == "disabled":
        return Thinking(enabled=False, effort=effort), None
    raise invalid(f"field 'thinking.type' must be enabled, adaptive or disabled; got {kind!r}", "thinking.type")


def _output_config(raw: Any) -> tuple[str | None, dict | None]:
    """Effort and JSON-schema format from `output_config`. Read leniently: it is optional extra."""
    if not isinstance(raw, dict):
        return None, None
    effort = raw.get("effort") if isinstance(raw.get("effort"), str) else None
    fmt = raw.get("format")
    schema = fmt.get("schema") if isinstance(fmt, dict) else None
    return effort, schema if isinstance(schema, dict) else None
