"""Raw request bodies stored linearly: each compressed with zstd against an earlier body of its session.

Large response bodies (over ANSWER_APART) are stored the same way, against the session's earlier answers
(their own `BodyBases`): an OpenAI Responses stream echoes the whole request's tools and settings in three
of its events (~10 KB each for Codex), the same on every call.

An agent re-sends its whole history on every call, so a body is mostly an earlier one plus a little: the
earlier one's first bytes (the history up to where the new turn goes), a new middle, and often the
earlier one's last bytes too (a client that sends the system prompt and tools after the messages). A
splice stores how many bytes the two share at each end and only the middle, zstd-compressed with the
nearby part of the earlier body as a raw-content dictionary (LOOKBACK bytes before the middle, and what the
middle replaced), so what a call costs to store — in bytes and in CPU — follows what it adds, not its
history: at turn 120 of a Claude Code session (476 KB bodies) compressing against the whole earlier body
took ~1.7 ms and stored about as much. `body_encoding` says where and how a call's body is:

    NULL          in `request_body`, as it is (small bodies)
    "zlib"        in `request_body`, zlib, whole (rows written before delta encoding; still read)
    "zstd"        in the `bodies` table (row `body_id`), zstd, whole: a keyframe
    "zstd-delta"  in the `bodies` table, zstd with its whole `base` body as the dictionary (rows written
                  before splices; still read)
    "zstd-splice" in the `bodies` table: the `head` first and `tail` last bytes of its `base` body, and
                  between them `data` decompressed (zstd) with the dictionary `Splice.dictionary`

Each `bodies` row says how it is stored by itself (`head` set: a splice), so a chain read back may mix them.

A session's first body is compressed against the last keyframe of any session when that is smaller: a
harness sends the same system prompt and tools in every session. Large bodies live in their own table,
which nothing deletes from, so deleting a call's row never makes another call's body unreadable.
Linear in everything: a session's next keyframe comes once its deltas since the last one add up to
KEY_SHARE times that keyframe's size (keyframes then add at most 1/KEY_SHARE of the deltas' bytes; a
keyframe every k calls would grow as calls x context). Bounded reads: a chain of deltas ends in a
keyframe after at most CHAIN bodies.
Crash safety: the writer takes a body as a base only once the transaction that wrote it has committed
(`BodyBases.commit`), so no body references one that a failed write or a rolled-back transaction took away.
"""

from __future__ import annotations

import sqlite3
import zlib
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import zstandard

from polar.capture.dictionaries import SIZE, Dictionaries, decompress
from polar.capture.tokens import common_prefix_len
from polar.capture.working_set import DEFAULT, Evictions

SMALL = 1024  # bodies up to this many bytes are stored as they are, and never serve as a base
CHAIN = 128  # bodies per keyframe at most: reading one row alone decompresses at most this many
KEY_SHARE = 4  # a new keyframe once the deltas since the last take this many times its bytes
LEVEL = 3  # zstd level: at 100-200 KB bodies ~0.5 ms a body; higher levels gain ~2 %
BASES_PER_SESSION = 3  # a session's main thread, its sub-agents and side calls take turns
# A base whose bytes a newer body of its session repeats all but this many of is dropped: any later body
# is encoded as well against the newer one. A conversation that only grows then holds one base, not three.
SUPERSEDED = 4096
# The writer's memory for bases (all sessions together) is sized by working_set: past it the least recently
# used session's bases go and its next body is a keyframe, so round-robin turns of more sessions than fit
# store every body whole (64 MB held 115 of 256 128k-token sessions: 12.6 bytes per unique token instead of ~7).
WIDE = 1024 * 1024  # base + body above this: zstd parameters sized to them (slower: ~45 ms at 1.5 MB)
LOOKBACK = 32 * 1024  # bytes of the base before a splice's middle in its dictionary: the last turns' text
# Response bodies above this are stored as splices of the session's earlier answers: what they repeat can be
# more than a trained dictionary holds (dictionaries.SIZE). Smaller ones stay in their row, packed with the
# responses' dictionary, which takes what they share; as `bodies` rows they would take more pages, not fewer.
ANSWER_APART = SIZE


@dataclass(frozen=True)
class Base:
    id: int  # in the bodies table
    body: bytes
    depth: int  # deltas between this body and its keyframe
    since: int  # bytes of those deltas, as stored
    key: int  # bytes of that keyframe, as stored

    def may_grow(self) -> bool:
        return self.depth + 1 < CHAIN and self.since < KEY_SHARE * self.key


@dataclass(frozen=True)
class Splice:
    """A body as its base's first `head` bytes, a middle, and the base's last `tail` bytes; the middle is
    compressed against the base's `lookback` bytes before it and the bytes it replaced."""

    head: int
    tail: int
    lookback: int

    @classmethod
    def between(cls, base: bytes, body: bytes, head: int) -> Splice:
        """`head`: the bytes the two share at the start (already measured)."""
        room = min(len(base), len(body)) - head
        ends = [np.frombuffer(b, np.uint8)[len(b) - room :][::-1] for b in (base, body)] if room else []
        return cls(head, common_prefix_len(*ends) if room else 0, min(head, LOOKBACK))

    def middle(self, body: bytes) -> bytes:
        return body[self.head : len(body) - self.tail]

    def dictionary(self, base: bytes) -> bytes:
        return base[self.head - self.lookback : len(base) - self.tail]

    def join(self, base: bytes, middle: bytes) -> bytes:
        return base[: self.head] + middle + base[len(base) - self.tail :]


@dataclass(frozen=True)
class Encoded:
    data: bytes
    encoding: str | None  # body_encoding
    base: Base | None  # zstd-splice: the body it is spliced from
    splice: Splice | None = None


def _dictionary(body: bytes) -> zstandard.ZstdCompressionDict:
    return zstandard.ZstdCompressionDict(body, dict_type=zstandard.DICT_TYPE_RAWCONTENT)


def _spliced(base: Base, body: bytes, head: int) -> Encoded:
    splice = Splice.between(base.body, body, head)
    middle = splice.middle(body)
    return Encoded(_compressor(splice.dictionary(base.body), middle).compress(middle), "zstd-splice", base, splice)


def _compressor(base: bytes, body: bytes) -> zstandard.ZstdCompressor:
    """zstd at LEVEL against `base`. Past WIDE bytes, level 3's window and hash tables no longer reach the
    start of the base (a 1.5 MB body's delta is then ~ its whole size): size them to base + body."""
    size = len(base) + len(body)
    if size <= WIDE:
        return zstandard.ZstdCompressor(level=LEVEL, dict_data=_dictionary(base))
    log = min(27, (size - 1).bit_length())  # 27: the largest window a decoder accepts by default
    params = zstandard.ZstdCompressionParameters.from_level(LEVEL, window_log=log, hash_log=min(log, 26),
                                                            chain_log=min(log, 26))
    return zstandard.ZstdCompressor(compression_params=params, dict_data=_dictionary(base))


class BodyBases:
    """The writer's side: each session's last committed bodies, the candidates a new body is encoded against.

    Used by the one writer thread only. Bodies written in the open transaction wait in `_pending` and
    become bases on commit; `mark`/`undo` drop those of a write rolled back to its savepoint."""

    def __init__(self, max_bytes: int = DEFAULT.base_bytes, kind: str = "request bodies"):
        self.max_bytes = max_bytes
        self.evictions = Evictions(f"capture bases ({kind} the next ones are stored as splices of)")
        self._used: dict[str, float] = {}  # when each session last committed a body
        self._bases: OrderedDict[str, list[Base]] = OrderedDict()  # least recently used session first
        self._bytes = 0
        self._pending: list[tuple[str, Base, Base | None]] = []  # (session, new base, the base it supersedes)
        self._keyframe: Base | None = None  # the last committed keyframe: a new session's first base

    def encode(self, session: str, body: bytes) -> Encoded:
        if len(body) <= SMALL:
            return Encoded(body, None, None)
        best = self._best(session, body)
        if best is not None:
            base, head = best
            return _spliced(base, body, head) if base.may_grow() else Encoded(*pack(body), None)
        whole = Encoded(*pack(body), None)
        if self._keyframe is None or session in self._bases:  # a full chain: a keyframe, the new start
            return whole
        # The session's first body: the same harness sends the same system prompt and tools in every
        # session, so the last keyframe (of any session) usually holds most of it. Kept only if smaller.
        shared = _spliced(self._keyframe, body, _shared_head(self._keyframe.body, body))
        return shared if len(shared.data) < len(whole.data) else whole

    def _best(self, session: str, body: bytes) -> tuple[Base, int] | None:
        """The session's base sharing the longest prefix with `body` (the latest on a tie), and that prefix's
        length. When its chain may not grow, the body is a keyframe: an older base would serve, but with a
        larger delta."""
        found = [(base, _shared_head(base.body, body)) for base in reversed(self._bases.get(session, ()))]
        return max(found, key=lambda pair: pair[1], default=None)

    def wrote(self, session: str, body_id: int, body: bytes, encoded: Encoded) -> None:
        base, size = encoded.base, len(encoded.data)
        stored = Base(body_id, body, base.depth + 1, base.since + size, base.key) if base else Base(body_id, body, 0, 0, size)
        splice = encoded.splice
        superseded = base if splice and len(base.body) - splice.head - splice.tail <= SUPERSEDED else None
        self._pending.append((session, stored, superseded))

    def mark(self) -> int:
        return len(self._pending)

    def undo(self, mark: int) -> None:
        del self._pending[mark:]

    def abort(self) -> None:
        self._pending.clear()

    def commit(self) -> None:
        for session, base, superseded in self._pending:
            if base.depth == 0:
                self._keyframe = base
            bases = self._bases.pop(session, [])
            if superseded is not None and any(b is superseded for b in bases):  # (another session's keyframe is not)
                bases = [b for b in bases if b is not superseded]
                self._bytes -= len(superseded.body)
            bases.append(base)
            self._bytes += len(base.body)
            while len(bases) > BASES_PER_SESSION:
                self._bytes -= len(bases.pop(0).body)
            self._bases[session] = bases
            self._used[session] = self.evictions.now()
        self._pending.clear()
        while self._bytes > self.max_bytes and self._bases:
            session, dropped = self._bases.popitem(last=False)
            self._bytes -= sum(len(b.body) for b in dropped)
            self.evictions.dropped(self._used.pop(session))


def _shared_head(base: bytes, body: bytes) -> int:
    return common_prefix_len(np.frombuffer(base, np.uint8), np.frombuffer(body, np.uint8))


def write_body(conn: sqlite3.Connection, encoded: Encoded) -> dict[str, Any]:
    """The call's request body columns; a large body goes to the `bodies` table first."""
    if encoded.encoding is None:
        return {"request_body": encoded.data, "body_encoding": encoded.encoding, "body_id": None}
    return {"request_body": None, "body_encoding": encoded.encoding, "body_id": store(conn, encoded)}


def store(conn: sqlite3.Connection, encoded: Encoded) -> int:
    """A `bodies` row for an encoded (not stored-as-is) body; its id."""
    base = encoded.base.id if encoded.base else None
    ends = (s.head, s.tail, s.lookback) if (s := encoded.splice) else (None, None, None)  # NULLs: not a splice
    return conn.execute("INSERT INTO bodies (base, data, head, tail, lookback) VALUES (?, ?, ?, ?, ?)",
                        (base, encoded.data, *ends)).lastrowid


def read_body(conn: sqlite3.Connection, row: Mapping[str, Any], memo: dict[int, bytes]) -> bytes | None:
    """A call's request body, byte for byte. `memo` maps a `bodies` id → body, so reading a session in
    order decompresses each body once (`_remember` bounds it)."""
    if row.get("body_id") is None:
        return unpack(row["request_body"], row.get("body_encoding"), f"capture row {row['id']}")
    return read_stored(conn, row["body_id"], f"capture row {row['id']}", memo)


def read_stored(conn: sqlite3.Connection, body_id: int, owner: str, memo: dict[int, bytes]) -> bytes:
    """A `bodies` row's body, byte for byte, decoding its chain back to a keyframe or a memoised body.
    `owner`: whose body it is, for the error when a link is missing."""
    chain: list[tuple] = []
    cur: int | None = body_id
    while cur is not None and cur not in memo:
        found = _body_row(conn, cur)
        if found is None or (found[0] is not None and found[0] >= cur):
            raise LookupError(f"body {cur} (of {owner}) is missing")
        chain.append((cur, *found))
        cur = found[0]
    for link, base, data, head, tail, lookback in reversed(chain):  # from the keyframe (or a memoised body) on
        if base is None:
            body = zstandard.ZstdDecompressor().decompress(data)
        elif head is None:  # zstd-delta
            body = zstandard.ZstdDecompressor(dict_data=_dictionary(memo[base])).decompress(data)
        else:
            splice = Splice(head, tail, lookback)
            codec = zstandard.ZstdDecompressor(dict_data=_dictionary(splice.dictionary(memo[base])))
            body = splice.join(memo[base], codec.decompress(data))
        _remember(memo, link, body)
    return memo[body_id]


def _body_row(conn: sqlite3.Connection, body_id: int) -> tuple | None:
    """(base, data, head, tail, lookback) of a `bodies` row; the splice columns NULL in a database written
    before splices (readers open it read-only: the writer's schema.ensure adds them)."""
    try:
        return conn.execute("SELECT base, data, head, tail, lookback FROM bodies WHERE id=?", (body_id,)).fetchone()
    except sqlite3.OperationalError:  # no such column
        return conn.execute("SELECT base, data, NULL, NULL, NULL FROM bodies WHERE id=?", (body_id,)).fetchone()


COLUMN_SMALL = 256  # a column's bytes over this are compressed: a turn's answer (~1 KB of JSON) to ~60 %


def pack(data: bytes, squeeze: Callable[[bytes], bytes] | None = None) -> tuple[bytes, str | None]:
    """Bytes stored on their own: zstd-compressed (encoding "zstd") unless COLUMN_SMALL or fewer.
    `squeeze`: the compressor (a kind's, with its dictionary: dictionaries.py); plain zstd by default."""
    if len(data) <= COLUMN_SMALL:
        return data, None
    return (squeeze or compress)(data), "zstd"


def compress(data: bytes) -> bytes:
    """zstd at LEVEL, whole (what `unpack` reads back as "zstd")."""
    return zstandard.ZstdCompressor(level=LEVEL).compress(data)


def pack_json(text: str, squeeze: Callable[[bytes], bytes] | None = None) -> str | bytes:
    """JSON text as a column holds it: the text (readable by SQLite's JSON functions), or (a BLOB) the
    text zstd-compressed when over COLUMN_SMALL bytes and smaller so."""
    raw = text.encode()
    data, encoding = pack(raw, squeeze)
    return text if encoding is None or len(data) >= len(raw) else data


def unpack_json(value: str | bytes, dictionaries: Dictionaries | None = None) -> str | bytes:
    """What `pack_json` stored, for json.loads (which takes the UTF-8 bytes as they are)."""
    return value if isinstance(value, str) else unpack(value, "zstd", "a JSON column", dictionaries)


def unpack(data: bytes | None, encoding: str | None, what: str, dictionaries: Dictionaries | None = None) -> bytes | None:
    """What `pack` (or the earlier writer: "zlib") stored, back; `dictionaries`: the database's, for values
    compressed with one."""
    if encoding is None or data is None:
        return data
    if encoding == "zlib":
        return zlib.decompress(data)
    if encoding == "zstd":
        return decompress(data, dictionaries)
    raise ValueError(f"{what}: unknown encoding {encoding!r}")


MEMO_BODIES = 64  # a reader keeps this many decoded bodies: enough for interleaved sessions, bounded


def _remember(memo: dict[int, bytes], body_id: int, body: bytes) -> None:
    memo[body_id] = body
    if len(memo) > MEMO_BODIES:
        del memo[next(iter(memo))]
