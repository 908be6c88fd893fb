"""zstd dictionaries trained on a capture database's own values: the small pieces every call stores.

Each call stores a few small values shaped like every other call's: its request headers (~0.7 KB, the same
on every call of a harness), its canonical request beside the messages, its result, its response (a
streamed answer is one event per token) and its new messages. Compressed one by one, each pays again for
the keys and framing it shares with all the others. Compressed with a dictionary trained on the first
SAMPLES values of its kind, what they share is nearly free: a harness's headers and streamed responses
shrink several-fold (docs/benchmarks.md, "Storage at the agent shape").

A dictionary is stored in the `dictionaries` table under its own zstd dictionary id, which each frame
compressed with it names in its header: a value still says by itself how to read it, and the column
formats stay what they were ("zstd", or a BLOB in a JSON column). A dictionary is used only once the
transaction storing it has committed, so no committed row names one that is not there; it is trained and
stored by the writer's thread (once per kind and database), and a writer opening a database that
has dictionaries uses the newest of each kind. A dictionary learns from the database's first values: a
harness that arrives later gains less from it, never much worse than none (a few bytes a value).
"""

from __future__ import annotations

import logging
import random
import sqlite3
import time
from collections.abc import Callable

import zstandard

log = logging.getLogger("polar.capture")

KINDS = ("headers", "canonical", "result", "response", "message")
SAMPLES = 64  # values of a kind a dictionary is trained on
SIZE = 8 * 1024  # bytes of a dictionary: small values want a small one (32 KB compressed worse here)
LEVEL = 3  # as bodies.LEVEL
_TRAIN_AT = (SAMPLES, 2 * SAMPLES, 4 * SAMPLES)  # sample counts a kind is trained at, until it takes
_IDS = (32768, 2**31)  # zstd reserves dictionary ids below 32768 and from 2**31


class Plain:
    """Small values compressed without dictionaries (what a `Packer` does until it has one)."""

    def of(self, kind: str) -> Callable[[bytes], bytes]:
        """The compressor of one kind of value."""
        return lambda data: self.compress(kind, data)

    def compress(self, kind: str, data: bytes) -> bytes:
        return zstandard.ZstdCompressor(level=LEVEL).compress(data)


class Packer(Plain):
    """The writer's compression of small values: plain zstd until SAMPLES values of a kind have been seen,
    then zstd with the dictionary trained on them, once stored (`store`). The writer's thread only."""

    def __init__(self, conn: sqlite3.Connection):
        self._plain = zstandard.ZstdCompressor(level=LEVEL)
        self._compressors: dict[str, zstandard.ZstdCompressor] = {}
        rows = conn.execute("SELECT kind, data FROM dictionaries ORDER BY t_created").fetchall()
        for kind, data in rows:  # the newest of each kind wins
            self._compressors[kind] = _compressor(zstandard.ZstdCompressionDict(data))
        self._samples: dict[str, list[bytes]] = {kind: [] for kind in KINDS if kind not in self._compressors}
        self._pending: dict[str, zstandard.ZstdCompressionDict] = {}  # trained, waiting to be stored

    def compress(self, kind: str, data: bytes) -> bytes:
        compressor = self._compressors.get(kind)
        if compressor is not None:
            return compressor.compress(data)
        samples = self._samples.get(kind)
        if samples is not None:
            samples.append(data)
            if len(samples) in _TRAIN_AT and kind not in self._pending:
                self._train(kind, samples)
        return self._plain.compress(data)

    def _train(self, kind: str, samples: list[bytes]) -> None:
        try:
            self._pending[kind] = zstandard.train_dictionary(SIZE, samples, dict_id=random.randrange(*_IDS),
                                                             level=LEVEL)
        except zstandard.ZstdError as exc:  # too little to learn from yet: try with twice the samples, then none
            if len(samples) >= _TRAIN_AT[-1]:
                log.info("no %s dictionary: %s", kind, exc)
                del self._samples[kind]

    def store(self, conn: sqlite3.Connection) -> None:
        """Store the dictionaries trained since the last call, each in a transaction of its own (none may be
        open), and use each from then on. One that cannot be stored now is tried again next time."""
        for kind, dictionary in list(self._pending.items()):
            try:
                conn.execute("BEGIN IMMEDIATE")
                conn.execute("INSERT INTO dictionaries (id, kind, data, t_created) VALUES (?, ?, ?, ?)",
                             (dictionary.dict_id(), kind, dictionary.as_bytes(), time.time()))
                conn.execute("COMMIT")
            except sqlite3.Error as exc:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                if isinstance(exc, sqlite3.IntegrityError):  # its id is taken (another writer): train anew
                    del self._pending[kind]
                    self._train(kind, self._samples[kind])
                continue
            del self._pending[kind], self._samples[kind]
            self._compressors[kind] = _compressor(dictionary)

    @property
    def waiting(self) -> bool:
        return bool(self._pending)


class Dictionaries:
    """The reader's: each dictionary a database's values name, loaded once from its `dictionaries` table."""

    def __init__(self, conn: sqlite3.Connection):
        self._conn = conn
        self._codecs: dict[int, zstandard.ZstdDecompressor] = {}

    def decompressor(self, dict_id: int) -> zstandard.ZstdDecompressor:
        codec = self._codecs.get(dict_id)
        if codec is None:
            row = self._conn.execute("SELECT data FROM dictionaries WHERE id=?", (dict_id,)).fetchone()
            if row is None:
                raise LookupError(f"zstd dictionary {dict_id} is not in this capture database")
            codec = self._codecs[dict_id] = zstandard.ZstdDecompressor(dict_data=zstandard.ZstdCompressionDict(row[0]))
        return codec


def decompress(data: bytes, dictionaries: Dictionaries | None = None) -> bytes:
    """A zstd frame, with the dictionary its header names (if any)."""
    dict_id = zstandard.get_frame_parameters(data).dict_id
    if not dict_id:
        return zstandard.ZstdDecompressor().decompress(data)
    if dictionaries is None:
        raise LookupError(f"this value was compressed with zstd dictionary {dict_id}: read it with its database's "
                          "dictionaries (CaptureReader does)")
    return dictionaries.decompressor(dict_id).decompress(data)


def _compressor(dictionary: zstandard.ZstdCompressionDict) -> zstandard.ZstdCompressor:
    return zstandard.ZstdCompressor(level=LEVEL, dict_data=dictionary)

