"""Where a call goes: its session's replica, else where its prompt's prefix most likely is cached, else the
least loaded — every choice within an imbalance bound on in-flight tokens.

A session's KV cache sits on the replica that served its last call: its next call goes there while that
replica is in and not overloaded. A new session goes where other sessions with the same prompt start went:
first the same system prompt, tools and first message (the N samples of one task), then the same system
prompt and tools (one harness), unless that replica is overloaded — and, for the harness alone, unless it
holds more than `imbalance` x the mean number of sessions (every session of a harness shares that prefix:
in-flight tokens alone would pile a slow trickle of sessions onto one replica). Otherwise the least loaded
replica by in-flight tokens (ties: the one holding fewer sessions). Overloaded: its in-flight tokens exceed
`imbalance` x the mean over the replicas in, plus the call's own tokens (one call's slack: with few calls in
flight, a session would otherwise leave its cache because of one other call). Routing is a few dict lookups and a pass over the
replicas: no I/O, no lock (it runs on the proxy's event loop).
"""

from __future__ import annotations

import hashlib
import itertools
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from polar.canonical import ChatRequest
from polar.sessions.fingerprints import message_fingerprint, request_context_key
from polar.sessions.state import SessionView
from polar.upstream.fleet.replicas import Replica

# Bounded memories (least recently used go first): a session forgotten is placed again like a new one.
MAX_SESSIONS = 200_000
MAX_PREFIXES = 50_000


@dataclass(frozen=True)
class CallShape:
    """What routing needs of a call: its session, its prefix keys (most specific first), its token estimate."""

    session: str | None
    prefixes: tuple[str, ...]
    tokens: int


def call_shape(request: ChatRequest, session: SessionView | None) -> CallShape:
    """A call's routing keys, from the message fingerprints the gateway computed anyway."""
    keys = session.keys if session is not None else [message_fingerprint(m) for m in request.messages]
    lead = 0
    while lead < len(request.messages) and request.messages[lead].role == "system":
        lead += 1
    context = request_context_key(request)
    prefixes = tuple(_digest(context, keys[:n]) for n in (lead + 1, lead) if n and n <= len(keys))
    if session is not None and session.state.turns:
        tokens = len(session.state.turns[-1].ids) + 64  # the last turn, plus what the new messages add
    else:
        tokens = sum(len(m.text()) for m in request.messages) // 4 + 64  # ~4 characters a token
    return CallShape(session.session_id or None if session is not None else None, prefixes, tokens)


def _digest(context: str, keys: Sequence[str]) -> str:
    return hashlib.blake2b("\0".join([context, *keys]).encode(), digest_size=12).hexdigest()


@dataclass(frozen=True)
class Placement:
    replica: Replica
    why: str  # affinity | prefix | least-loaded | moved (its replica was out or overloaded)


class Router:
    def __init__(self, replicas: Sequence[Replica], imbalance: float = 1.5):
        if imbalance < 1.0:
            raise ValueError(f"the imbalance bound is a factor of the mean load, at least 1, not {imbalance}")
        self.replicas = list(replicas)
        self.imbalance = imbalance
        self._sessions: OrderedDict[str, Replica] = OrderedDict()
        self._prefixes: OrderedDict[str, Replica] = OrderedDict()
        self.counts = {"affinity": 0, "prefix": 0, "least-loaded": 0, "moved": 0}
        self._held: dict[Replica, int] = {}  # sessions per replica, kept with _sessions

    def place(self, shape: CallShape, exclude: Sequence[Replica] = ()) -> Placement | None:
        """Where this call goes (None: no replica is in). Remembers the choice for the session and its prefixes."""
        up = [r for r in self.replicas if r.up and r not in exclude]
        if not up:
            return None
        bound = self.imbalance * sum(r.load for r in up) / len(up) + shape.tokens
        home = self._sessions.get(shape.session) if shape.session else None
        if home is not None and home in up and home.load <= bound:
            placement = Placement(home, "affinity")
        else:
            placement = None
            if home is None:  # a new session: where its prefix went, within the bound
                held_bound = self.imbalance * sum(self._held.get(r, 0) for r in up) / len(up)
                for n, key in enumerate(shape.prefixes):
                    prefix_home = self._prefixes.get(key)
                    if (prefix_home is not None and prefix_home in up and prefix_home.load <= bound
                            and (n == 0 or self._held.get(prefix_home, 0) <= held_bound)):
                        placement = Placement(prefix_home, "prefix")
                        break
            if placement is None:
                held = self._held
                least = min(up, key=lambda r: (r.load, held.get(r, 0)))
                placement = Placement(least, "least-loaded" if home is None else "moved")
        self.counts[placement.why] += 1
        self._remember(shape, placement.replica)
        return placement

    def forget(self, replica: Replica) -> None:
        """A replica left the fleet for good: its prefixes are no longer cached anywhere."""
        for memory in (self._sessions, self._prefixes):
            for key in [k for k, r in memory.items() if r is replica]:
                del memory[key]
        self._held.pop(replica, None)

    def sessions_on(self) -> dict[str, int]:
        """Sessions each replica holds (by URL), as routing last placed them."""
        held = self._held
        return {r.url: held.get(r, 0) for r in self.replicas}

    def _remember(self, shape: CallShape, replica: Replica) -> None:
        if shape.session:
            held = self._held
            old = self._sessions.pop(shape.session, None)
            if old is not None:
                held[old] -= 1
            self._sessions[shape.session] = replica
            held[replica] = held.get(replica, 0) + 1
            if len(self._sessions) > MAX_SESSIONS:
                _, gone = self._sessions.popitem(last=False)
                held[gone] -= 1
        for key in shape.prefixes:
            self._prefixes.pop(key, None)
            self._prefixes[key] = replica
            if len(self._prefixes) > MAX_PREFIXES:
                self._prefixes.popitem(last=False)


class RoundRobin(Router):
    """Every call to the next replica in turn, sessions and prefixes unknown: what a generic router does (the
    benchmarks' and tests' baseline for the prefix-cache hit rate)."""

    def __init__(self, replicas: Sequence[Replica], imbalance: float = 1.5):
        super().__init__(replicas, imbalance)
        self._turn = itertools.cycle(self.replicas)

    def place(self, shape: CallShape, exclude: Sequence[Replica] = ()) -> Placement | None:
        for _ in self.replicas:
            replica = next(self._turn)
            if replica.up and replica not in exclude:
                return Placement(replica, "least-loaded")
        return None
