"""Fingerprints of what the model conditions on: which earlier turn a new request extends.

A new request *extends* a turn when its messages start with that turn's messages followed by the
assistant message polar answered with; its prompt is then the turn's ids plus the rendering of
only the new messages (sessions/state.py).

Messages are compared by a fingerprint of what the model conditions on — role, text, tool calls
(name + parsed arguments + id), tool results — not by the client's serialisation: clients re-send
arguments re-serialised, strip whitespace, or drop earlier reasoning, none of which changes what
the model sampled. Reasoning is left out of the fingerprint on purpose: the sampled reasoning
tokens stay in the buffer even when a client drops them (that is the point of token-in).

Tool-call ids count by their letters and digits only: some harnesses replay them normalised
(OpenClaw on Chat and Gemini sends `call_ab12` back as `callab12`). The id pairs a call with its
result; two ids of one conversation that differ only in punctuation do not occur in practice, and
the sampled ids a matched turn stands for are kept whatever spelling the harness replays.
"""

from __future__ import annotations

import hashlib
import json
import re

import orjson

from polar.canonical import ChatRequest, ChatResult, Message, TextPart, ToolCall
from polar.object_memo import ObjectMemo

_ID_PUNCTUATION = re.compile(r"[^0-9A-Za-z]")


def id_key(call_id: str | None) -> str | None:
    """A tool-call id as fingerprints compare it: its letters and digits (None stays None)."""
    return None if call_id is None else _ID_PUNCTUATION.sub("", call_id)


def _calls_key(calls: list[ToolCall]) -> list:
    return [[id_key(c.id), c.name, c.arguments_obj()] for c in calls]


def _fingerprint(msg: Message) -> str:
    if msg.role == "assistant":
        key = ["assistant", msg.text().strip(), _calls_key(msg.tool_calls)]
    else:
        key = [msg.role, msg.text(), id_key(msg.tool_call_id), msg.is_error,
               [p.model_dump() for p in msg.content if p.type != "text"]]
    return _digest(key)


# Once per message object: a session's calls share the messages their histories repeat (providers/history.py).
message_fingerprint = ObjectMemo(_fingerprint)


def _digest(key: list) -> str:
    # Every message of every request is fingerprinted: orjson serialises ~3x faster than json. It refuses
    # integers beyond 64 bits (valid in tool arguments), which json then serialises. Fingerprints are never
    # stored, so the two serialisations need not agree.
    try:
        text = orjson.dumps(key, option=orjson.OPT_SORT_KEYS)
    except orjson.JSONEncodeError:
        text = json.dumps(key, sort_keys=True, ensure_ascii=False).encode()
    return hashlib.blake2b(text, digest_size=16).hexdigest()


# Each tool's once per tool object: a session's calls share the tools they repeat (providers/history.py).
_tool_digest = ObjectMemo(lambda tool: _digest(tool.model_dump()))


def request_context_key(request: ChatRequest) -> str:
    """What must not change between turns for a prefix to be reusable: tools and thinking mode."""
    return _digest([[_tool_digest(t) for t in request.tools], request.thinking.enabled])


def answer_message(result: ChatResult) -> Message:
    """The assistant message polar answered with, as a client will send it back."""
    return Message(
        role="assistant",
        content=[TextPart(text=result.content)] if result.content else [],
        reasoning=[result.reasoning] if result.reasoning else [],
        tool_calls=result.tool_calls,
    )
