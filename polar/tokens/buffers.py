"""Per-session token buffers: the exact ids of each turn, and which turn a new request extends.

A turn is what polar sent and got: the prompt ids, the sampled ids (stop token included), the
canonical messages of the request and the assistant message polar answered with. A new request
*extends* a turn when its messages start with that turn's messages followed by that assistant
message; its prompt is then the turn's ids plus the rendering of only the new messages.

Messages are compared by a fingerprint of what the model conditions on — role, text, tool calls
(name + parsed arguments + id), tool results — not by the client's serialisation: clients re-send
arguments re-serialised, strip whitespace, or drop earlier reasoning, none of which changes what
the model sampled. Reasoning is left out of the fingerprint on purpose: the sampled reasoning
tokens stay in the buffer even when a client drops them (that is the point of token-in).
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from polar.canonical import ChatRequest, Message, ToolCall


def _calls_key(calls: list[ToolCall]) -> list:
    out = []
    for c in calls:
        args = c.arguments_obj()
        out.append([c.id, c.name, args])
    return out


def message_fingerprint(msg: Message) -> str:
    if msg.role == "assistant":
        key = ["assistant", msg.text().strip(), _calls_key(msg.tool_calls)]
    else:
        key = [msg.role, msg.text(), msg.tool_call_id, msg.is_error,
               [p.model_dump() for p in msg.content if p.type != "text"]]
    return hashlib.blake2b(json.dumps(key, sort_keys=True, ensure_ascii=False).encode(), digest_size=16).hexdigest()


def request_context_key(request: ChatRequest) -> str:
    """What must not change between turns for a prefix to be reusable: tools and thinking mode."""
    key = [[t.model_dump() for t in request.tools], request.thinking.enabled]
    return hashlib.blake2b(json.dumps(key, sort_keys=True).encode(), digest_size=16).hexdigest()


@dataclass
class Turn:
    call_row: int
    context_key: str
    message_keys: list[str]  # fingerprints of the request's messages
    answer_key: str  # fingerprint of the assistant message polar returned
    ids: np.ndarray  # prompt ids + sampled ids
    prompt_len: int
    ended_with_eos: bool


@dataclass
class Extension:
    turn: Turn
    new_messages: list[Message]


class SessionBuffers:
    """Recent turns per session, bounded in sessions and in turns kept per session."""

    def __init__(self, max_sessions: int = 4096, turns_per_session: int = 16):
        self.max_sessions = max_sessions
        self.turns_per_session = turns_per_session
        self._sessions: OrderedDict[str, list[Turn]] = OrderedDict()
        self._lock = threading.Lock()

    def find(self, session: str, request: ChatRequest, keys: list[str]) -> tuple[Extension | None, str]:
        """The longest earlier turn this request extends, or None and the reason why not.

        `keys` are the request's message fingerprints (computed once by the caller, who records
        them with the new turn).
        """
        turns = self._sessions.get(session)
        if not turns:
            return None, "first call of the session"
        if not any(m.role == "assistant" for m in request.messages):
            return None, "a new conversation in this session (no assistant turn in its history)"
        context = request_context_key(request)
        best: Turn | None = None
        reason = "no earlier turn's messages and answer are a prefix of this request"
        for turn in turns:
            n = len(turn.message_keys)
            if len(keys) <= n or keys[:n] != turn.message_keys or keys[n] != turn.answer_key:
                continue
            if turn.context_key != context:
                reason = "tools or thinking mode changed since the turn this request continues"
                continue
            if best is None or n > len(best.message_keys):
                best = turn
        if best is None:
            return None, reason
        return Extension(best, request.messages[len(best.message_keys) + 1 :]), ""

    def record(self, session: str, turn: Turn, extended: Turn | None = None) -> None:
        """Keep `turn`; the turn it extended is dropped, so a lineage holds one buffer (linear memory)."""
        with self._lock:
            turns = [t for t in self._sessions.pop(session, []) if t is not extended]
            turns.append(turn)
            self._sessions[session] = turns[-self.turns_per_session :]
            while len(self._sessions) > self.max_sessions:
                self._sessions.popitem(last=False)
