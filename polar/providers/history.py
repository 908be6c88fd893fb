"""A session's history, read once: what keeps a call's parse proportional to what is new in it.

An agent re-sends its whole conversation on every call — at turn 120 of a Claude Code session, 240
messages — so reading every history item into canonical messages on every call made the parse grow with
the turn. Each provider reads its history items (Anthropic and Chat `messages`, Responses `input`,
Gemini `contents`) in order with a `HistoryReader` whose messages for the first n items depend on those
n items only. A `History` keeps a session's last reads: each item's JSON text, the messages read from the
items, and checkpoints — after item i, how many messages were complete (no later item adds to them), how
many notes had been taken, and the reader's other state. The next call compares its items with a kept
read's by their JSON text (json_values.exact: Python's `==` takes 1, 1.0 and true as one, a template
renders each as written), resumes the reader at the last checkpoint within the common prefix and reads
only the items after it. Texts compare only for bodies orjson decoded (gateway/body.decode: no NaN, which
orjson writes as null); the gateway reads other bodies whole. A read keeps texts, not decoded items: about
its body's size in memory. Request parts such as the tools are reused the same way (`History.part`).

Reading with a `History` gives what reading without one gives, message for message and note for note
(tests/providers/test_history.py replays random edits of the six CLIs' real requests through both).
The messages it hands out are shared with later calls of the session: once read, a canonical message is
never modified (the gateway, the token builder and the capture only read them).
"""

from __future__ import annotations

import bisect
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from polar.canonical import Message
from polar.capture.working_set import DEFAULT, Evictions
from polar.json_values import exact, same

T = TypeVar("T")


class HistoryReader(Protocol):
    """Reads one request's history items in order. `messages` and `notes` only grow, except that the last
    message may still take more items until the reader is settled."""

    messages: list[Message]
    notes: list[str]  # what the reader left out or changed (rewrite notes), in order

    def read(self, index: int, item: Any) -> None:
        """Read item `index`; raise a GatewayError for one a client must fix."""

    def checkpoint(self) -> tuple | None:
        """None while the last message may still take more items; else the reader's state beyond its
        messages and notes (immutable: it is kept), from which `resume` carries on."""

    def resume(self, messages: list[Message], notes: list[str], state: tuple) -> None:
        """Carry on after the items that gave these messages, notes and checkpoint state."""


@dataclass(frozen=True)
class Checkpoint:
    items: int  # items read
    messages: int  # messages complete after them
    notes: int
    state: tuple


@dataclass
class _Read:
    texts: list[bytes | None]  # each item's JSON (json_values.exact): what the next items are compared with
    messages: list[Message]
    notes: list[str]
    checkpoints: list[Checkpoint]  # by `items`, ascending
    size: int  # the request body's bytes: what the read is weighed by


def common_prefix(items: list[Any], texts: list[bytes | None], computed: list[bytes | None]) -> int:
    """How many leading `items` are the JSON an earlier read's `texts` say (by text, not `==`: 1 == 1.0 == True
    in Python, and a template renders each as written). The items' own texts are added to `computed` as far
    as they are made."""
    n = 0
    for item, text in zip(items, texts):
        if len(computed) <= n:
            computed.append(exact(item))
        if text is None or computed[n] != text:
            break
        n += 1
    return n


class History:
    """One session's last reads of one provider's history (a main conversation and its sub-agents'
    interleave: each call resumes the read it shares most items with)."""

    def __init__(self, keep: int = 3, resized: Callable[[int], None] | None = None):
        self.keep = keep
        self.used = 0.0  # when its session last called (Histories' clock)
        self.reads: list[_Read] = []
        # name -> its last `keep` (raw, its exact JSON, what it was read into), the most recent last: a main
        # conversation and its sub-agents send different system prompts and tools, taking turns.
        self._parts: dict[str, list[tuple[Any, bytes | None, Any]]] = {}
        self.body_bytes = 0  # the request about to be read: what its read weighs (`Histories.get` sets it)
        self._resized = resized  # told how many body bytes the kept reads gained (or lost)

    @property
    def size(self) -> int:
        return sum(r.size for r in self.reads)

    def read(self, items: list[Any], reader: HistoryReader) -> list[Message]:
        """Every item read into `reader` — resumed after the longest prefix an earlier read shares — and
        its messages. The read is kept for the next call (the oldest of `keep` reads dropped)."""
        best, shared, texts = None, 0, []
        for earlier in self.reads:
            n = common_prefix(items, earlier.texts, texts)
            if n > shared:
                best, shared = earlier, n
        checkpoints: list[Checkpoint] = []
        start = 0
        if best is not None:
            at = bisect.bisect_right(best.checkpoints, shared, key=lambda c: c.items)
            if at:
                resume = best.checkpoints[at - 1]
                reader.resume(best.messages[: resume.messages], best.notes[: resume.notes], resume.state)
                checkpoints, start = best.checkpoints[:at], resume.items
        for index in range(start, len(items)):
            reader.read(index, items[index])
            state = reader.checkpoint()
            if state is not None:
                checkpoints.append(Checkpoint(index + 1, len(reader.messages), len(reader.notes), state))
        before = self.size
        if best is not None:
            self.reads.remove(best)
        texts += [exact(item) for item in items[len(texts) :]]
        self.reads.append(_Read(texts, reader.messages, reader.notes, checkpoints, self.body_bytes))
        del self.reads[: -self.keep]
        if self._resized is not None:
            self._resized(self.size - before)
        return reader.messages

    def part(self, name: str, raw: Any, read: Callable[[], T]) -> T:
        """What `read()` gives, reused while the session's requests send an equal `raw` under `name` (an agent
        sends the same tens of KB of tools on every call). `read` depends on `raw` alone; its value is shared
        with later calls, so it is never modified."""
        kept = self._parts.setdefault(name, [])
        for n in range(len(kept) - 1, -1, -1):
            if same(raw, kept[n][0], kept[n][1]):
                kept.append(kept.pop(n))
                return kept[-1][2]
        value = read()
        kept.append((raw, exact(raw), value))
        del kept[: -self.keep]
        return value


def read_part(history: History | None, name: str, raw: Any, read: Callable[[], T]) -> T:
    """`read()`, through the session's `history` when there is one."""
    return read() if history is None else history.part(name, raw, read)


def read_history(items: list[Any], reader: HistoryReader, history: History | None) -> list[Message]:
    """The messages of `items`: through the session's `history` when there is one, else every item."""
    if history is not None:
        return history.read(items, reader)
    for index, item in enumerate(items):
        reader.read(index, item)
    return reader.messages


class Histories:
    """Every session's `History`, per provider; the least recently used go first once the kept reads
    weigh more than `max_bytes` of request bodies (their texts take about that; their messages, shared
    with the calls in flight and the session state, a few times it). A session whose history went is read
    whole on its next call: slower, never different. The default holds ~450 sessions' 128k-token agent
    bodies (~550 KB each; their reads ~8x that in memory): sessions taking turns round-robin beyond what
    fits would each be read whole on every call."""

    def __init__(self, max_bytes: int = DEFAULT.history_bytes, keep: int = 3):
        self.max_bytes, self.keep = max_bytes, keep
        self.evictions = Evictions("histories (each session's last reads of its request)")
        self._all: OrderedDict[tuple[str, str], History] = OrderedDict()
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._all)

    @property
    def bytes(self) -> int:
        return self._bytes

    def get(self, session: str, provider: str, body_bytes: int) -> History:
        """The session's History of this provider's format, about to read a request of `body_bytes`."""
        key = (session, provider)
        history = self._all.pop(key, None) or History(self.keep, self._resized)
        self._all[key] = history  # the most recently used last
        history.body_bytes, history.used = body_bytes, self.evictions.now()
        return history

    def _resized(self, delta: int) -> None:
        self._bytes += delta
        while self._bytes > self.max_bytes and len(self._all) > 1:
            _, dropped = self._all.popitem(last=False)
            self._bytes -= dropped.size
            self.evictions.dropped(dropped.used)


class ToolNames(dict[str, str]):
    """Tool call id → name, for the calls read so far: a tool result carries the name of the call it answers
    (the wire formats send only the id). Rebuilt from the messages when a reader resumes."""

    @classmethod
    def of(cls, messages: list[Message]) -> ToolNames:
        return cls({call.id: call.name for message in messages for call in message.tool_calls})

    def add(self, message: Message) -> None:
        for call in message.tool_calls:
            self[call.id] = call.name


class MessageReader:
    """What most readers share: every item gives complete messages, and the state carried across items is the
    tool names read so far, which the messages themselves give back on `resume`. Subclasses define `read`."""

    def __init__(self) -> None:
        self.messages: list[Message] = []
        self.notes: list[str] = []
        self.names = ToolNames()  # so results can carry the name of the call they answer

    def checkpoint(self) -> tuple | None:
        return ()

    def resume(self, messages: list[Message], notes: list[str], state: tuple) -> None:
        self.messages, self.notes, self.names = messages, notes, ToolNames.of(messages)
