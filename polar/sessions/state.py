"""What polar keeps per session, in one place with one eviction policy.

Per session: its recent turns (the exact prompt + sampled ids of each captured call, with the
fingerprints of the messages that produced them) and the canonical messages of its last call with
their content addresses. The turns serve twice: token-faithful prompts extend the turn a request
continues (no sampled token is ever re-encoded), and the capture stores each prompt as a reference
into the turn sharing its longest prefix (linear storage).

The state is a cache of the capture database, never the truth: it is updated only after a call's
row has committed, and a session missing from memory (first call after a restart, or evicted) is
rebuilt from the database on its next call, off the event loop. Limits (documented in the README):
`max_sessions` sessions, `turns_per_session` turns each (sub-agents interleave lineages, so the last
call is not always the parent), and `max_tokens` ids in all; the least recently used session goes
first. A turn that a new one extends is dropped, and a turn holds the ids it shares with the earlier turn
it branches from as views of that turn's memory (sessions/shared_ids.py), so memory is linear in the
context whether or not turns are prefixes of each other.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from polar.canonical import ChatRequest, ChatResult, Message
from polar.capture.records import Lineage, MessageLog
from polar.capture.tokens import as_ids
from polar.capture.working_set import DEFAULT, Evictions
from polar.sessions.fingerprints import answer_message, message_fingerprint, request_context_key
from polar.sessions.shared_ids import SharedIds, held_tokens

log = logging.getLogger("polar.sessions")
# prompt_mode's note on a request asked again: its prompt is the earlier call's (row N), token for token.
REPEATED = "the prompt ids of the same request's earlier call, row"


@dataclass
class Turn:
    row: int  # the capture row holding these ids
    ids: SharedIds  # prompt ids + sampled ids (stop token included), sharing the parent turn's memory
    prompt_len: int
    context_key: str  # tools and thinking mode: a prefix is reusable only under the same ones
    message_keys: list[str]  # fingerprints of the request's messages
    answer_key: str  # fingerprint of the assistant message polar answered with


@dataclass
class Extension:
    turn: Turn
    new_messages: list[Message]


@dataclass
class Reappearance:
    """A request holding an earlier turn's first `kept` messages, then that turn's answer, then new
    messages: the harness moved or dropped what followed them (sessions/splice.py keeps the answer's ids)."""

    turn: Turn
    kept: int
    new_messages: list[Message]


@dataclass
class SessionState:
    turns: list[Turn] = field(default_factory=list)
    # The last call's canonical messages (as stored JSON dicts), their content addresses and its row.
    messages: MessageLog = field(default_factory=MessageLog)
    # Why the state holds what it holds, for prompt_mode when no turn can be extended.
    origin: str = "first call of the session"
    used: float = 0.0  # when the session last called (SessionStates' clock)

    @property
    def tokens(self) -> int:
        """Ids held in memory (a buffer shared by several turns counts once)."""
        return held_tokens(t.ids for t in self.turns)

    def branch_point(self, prompt_ids) -> Branch:
        """The turn sharing the prompt's longest prefix, and how long that prefix is."""
        prompt = as_ids(prompt_ids)
        best = Branch(None, 0)
        for turn in reversed(self.turns):  # the newest first: the longest, so older ones can seldom beat it
            if len(turn.ids) <= best.shared:
                continue
            shared = turn.ids.common_prefix_len(prompt)
            if shared > best.shared:
                best = Branch(turn, shared)
        return best

    def lineage(self, prompt_ids) -> Lineage:
        """How to store a prompt: as the ids it shares with the turn of its longest prefix, then its own."""
        return self.branch_point(prompt_ids).lineage

    def extension(self, request: ChatRequest, keys: list[str]) -> tuple[Extension | None, str]:
        """The longest earlier turn this request extends, or None and the reason why not."""
        if not self.turns:
            return None, self.origin
        if not any(m.role == "assistant" for m in request.messages):
            return None, "a new conversation in this session (no assistant turn in its history)"
        context = request_context_key(request)
        best: Turn | None = None
        reason = "no earlier turn's messages and answer are a prefix of this request"
        for turn in self.turns:
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

    def repeat(self, request: ChatRequest, keys: list[str]) -> Turn | None:
        """The newest earlier turn asked exactly this (the same messages, tools and thinking mode): a harness
        that sends a request again (a retry, the same step asked twice) gets that turn's prompt ids, which may
        hold sampled ids a render would re-encode."""
        context = request_context_key(request)
        for turn in reversed(self.turns):
            if turn.message_keys == keys and turn.context_key == context:
                return turn
        return None

    def reappearance(self, request: ChatRequest, keys: list[str]) -> Reappearance | None:
        """The earlier turn whose answer this request repeats after the longest run of that turn's first
        messages, when no turn is extended whole (the newest wins a tie)."""
        context = request_context_key(request)
        best: Reappearance | None = None
        for turn in self.turns:
            if turn.context_key != context:
                continue
            kept = _shared_run(keys, turn.message_keys)
            if 0 < kept < len(turn.message_keys) and kept < len(keys) and keys[kept] == turn.answer_key:
                if best is None or kept >= best.kept:
                    best = Reappearance(turn, kept, request.messages[kept + 1 :])
        return best

    def add(self, turn: Turn, keep: int) -> None:
        """Keep `turn`; turns whose ids it extends are dropped (they are its prefix)."""
        kept = [t for t in self.turns if not turn.ids.starts_with(t.ids)]
        self.turns = [*kept, turn][-keep:]


def _shared_run(a: list[str], b: list[str]) -> int:
    """How many leading keys the two lists share."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


@dataclass(frozen=True)
class Branch:
    """Where a prompt leaves the session's turns: the turn it shares most with, and how many ids."""

    turn: Turn | None
    shared: int

    @property
    def lineage(self) -> Lineage:
        return Lineage(self.turn.row if self.turn is not None else None, self.shared)

    def hold(self, ids, more=()) -> SharedIds:
        """`ids` then `more`, where `ids` starts with the `shared` ids of `turn`: those held as views of its memory."""
        if self.turn is None or not self.shared:
            return SharedIds.of(ids, more)
        return self.turn.ids.branch(self.shared, np.concatenate([as_ids(ids)[self.shared:], as_ids(more)]))


NO_BRANCH = Branch(None, 0)


@dataclass
class SessionView:
    """What a backend sees of the session a call belongs to."""

    state: SessionState
    keys: list[str]  # fingerprints of this request's messages, computed once
    session_id: str = ""  # the session's id: a fleet routes its calls by it (polar/upstream/fleet)
    # A repeated answer after part of its call's messages extends that call whole: the messages the harness
    # dropped stay where the model saw them (polar_dropped_messages=keep; sessions/splice.py otherwise).
    keep_dropped: bool = False

    def extension(self, request: ChatRequest) -> tuple[Extension | None, str]:
        return self.state.extension(request, self.keys)

    def repeat(self, request: ChatRequest) -> Turn | None:
        return self.state.repeat(request, self.keys)

    def reappearance(self, request: ChatRequest) -> Reappearance | None:
        return self.state.reappearance(request, self.keys)


def new_turn(row: int, request: ChatRequest, keys: list[str], result: ChatResult, prompt=None,
             branch: Branch = NO_BRANCH) -> Turn:
    """`prompt`: the prompt ids already as an array (the gateway converts them once per call); `branch`: the
    earlier turn whose first ids the prompt repeats (SessionState.branch_point), held as views of its memory."""
    prompt = as_ids(result.prompt_token_ids if prompt is None else prompt)
    return Turn(
        row=row,
        ids=branch.hold(prompt, result.completion_token_ids),
        prompt_len=len(result.prompt_token_ids),
        context_key=request_context_key(request),
        message_keys=keys,
        answer_key=message_fingerprint(answer_message(result)),
    )


class SessionStates:
    """Every session's state, bounded by one LRU policy, rebuilt lazily from the capture database."""

    def __init__(
        self,
        load: Callable[[str, int], list[dict[str, Any]]] | None = None,
        max_sessions: int = DEFAULT.state_sessions,
        turns_per_session: int = 16,
        max_tokens: int = DEFAULT.state_tokens,
    ):
        # `load(session, n)`: the session's last n completed calls with tokens (CaptureReader.recent_calls).
        self._load = load
        self.max_sessions = max_sessions
        self.turns_per_session = turns_per_session
        self.max_tokens = max_tokens
        self._states: OrderedDict[str, SessionState] = OrderedDict()
        self._tokens = 0
        self._loading: dict[str, asyncio.Future] = {}
        self.evictions = Evictions("session states (each session's turns as token ids)")

    def __len__(self) -> int:
        return len(self._states)

    async def get(self, session: str) -> SessionState:
        """The session's state; rebuilt from the capture database (in a thread) when not in memory."""
        state = self._states.get(session)
        if state is not None:
            self._states.move_to_end(session)
            return state
        if session in self._loading:  # another call of the session is rebuilding it
            return await asyncio.shield(self._loading[session])
        fut: asyncio.Future = asyncio.get_running_loop().create_future()
        self._loading[session] = fut
        try:
            state = await asyncio.to_thread(self._rebuild, session) if self._load else SessionState()
        except Exception as exc:  # the database is unreadable: go on without the history, say so
            log.error("could not rebuild session %s from the capture database: %s", session, exc)
            state = SessionState(origin=f"its earlier turns could not be read from the capture database ({exc})")
        finally:
            del self._loading[session]
        if session not in self._states:  # a call may have committed while we read
            self._put(session, state)
        fut.set_result(self._states[session])
        return self._states[session]

    def record(self, session: str, turn: Turn | None, messages: MessageLog | None) -> None:
        """After a call's row committed: remember its turn and its messages. A session not in memory is
        left alone: its next call rebuilds it from the database, this row included."""
        state = self._states.pop(session, None)
        if state is None:
            return
        self._tokens -= state.tokens
        if turn is not None:
            state.add(turn, self.turns_per_session)
        if messages is not None:
            state.messages = messages
        self._put(session, state)

    def _put(self, session: str, state: SessionState) -> None:
        self._states[session] = state
        state.used = self.evictions.now()
        self._tokens += state.tokens
        while len(self._states) > self.max_sessions or (self._tokens > self.max_tokens and len(self._states) > 1):
            _, evicted = self._states.popitem(last=False)
            self._tokens -= evicted.tokens
            self.evictions.dropped(evicted.used)

    def _rebuild(self, session: str) -> SessionState:
        state = SessionState()
        rows = self._load(session, self.turns_per_session) if self._load else []
        if rows:  # an evicted session, or the first call after a restart; none of its calls had tokens otherwise
            state.origin = f"none of the session's last {len(rows)} captured calls is a prefix of this request"
        for row in rows:
            canonical, result = row.get("canonical"), row.get("result")
            if not canonical or not result:
                continue
            request = ChatRequest.model_validate(canonical)
            answer = ChatResult.model_validate(
                {**result, "prompt_token_ids": row["prompt_ids"], "completion_token_ids": row["completion_ids"]}
            )
            keys = [message_fingerprint(m) for m in request.messages]
            prompt = as_ids(row["prompt_ids"])
            turn = new_turn(row["id"], request, keys, answer, prompt, state.branch_point(prompt))
            state.add(turn, self.turns_per_session)
        if rows and rows[-1].get("canonical"):
            state.messages = MessageLog.rebuilt(rows[-1]["id"], rows[-1]["canonical"]["messages"])
        return state

