"""Whole-prompt tokenizing that reuses the ids of turns already seen, exactly.

A prompt is rendered and tokenized whole on a session's first call (and whenever a turn cannot be
continued token-faithfully). Those prompts repeat most of their text across sessions: every session of
a harness opens with the same system prompt and tool list (Claude Code's: ~17k tokens, ~40-60 ms to
tokenize here), and a re-rendered session repeats its own earlier turns.

`SegmentIds` cuts the text before each occurrence of one turn marker (ChatML's `<|im_start|>`) and keeps
each piece's ids. This is exact because a fast tokenizer matches its added tokens in the raw text before
it normalises or pre-tokenizes anything: the text between two added tokens is tokenized on its own, so
the pieces' ids joined are the whole text's. That holds when the marker is matched on the raw text, strips
no neighbouring whitespace, and overlaps no other added token (`marker_splits_exactly`); otherwise, or
when the tokenizer is set to split special tokens, no `SegmentIds` is made or it encodes whole. The first
`check` calls are also compared with the whole text's encoding, and a difference turns reuse off for good.
"""

from __future__ import annotations

import logging
import threading
from array import array
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from polar.tokens.encoder import cut_on_raw_text

log = logging.getLogger("polar.tokens")

DEFAULT_MAX_IDS = 4_000_000  # ~16 MB of ids (plus their text): the system prompts and tools of many harnesses


class SegmentIds:
    """text -> ids equal to `encode(text)`, with each piece before `marker` kept for reuse (oldest out first)."""

    def __init__(
        self,
        encode: Callable[[str], list[int]],
        marker: str,
        *,
        max_ids: int = DEFAULT_MAX_IDS,
        check: int = 2,
        enabled: Callable[[], bool] = lambda: True,
        on_mismatch: Callable[[], None] | None = None,
    ):
        self._encode, self._marker, self._max_ids = encode, marker, max_ids
        self._check, self._enabled, self._on_mismatch = check, enabled, on_mismatch
        self._pieces: OrderedDict[str, array] = OrderedDict()
        self._held = 0
        self._lock = threading.Lock()  # whole-prompt renders run in worker threads
        self.reused_ids = 0  # counters for tests and logs
        self.encoded_ids = 0

    @classmethod
    def for_tokenizer(cls, tokenizer: Any, encode: Callable[[str], list[int]], marker: str,
                      **kwargs: Any) -> SegmentIds | None:
        """Reuse for this tokenizer and marker, or None when pieces cut at the marker would tokenize differently."""
        if not marker_splits_exactly(tokenizer, marker):
            return None

        def matches_special() -> bool:  # transformers' `split_special_tokens` would tokenize the marker as text
            return not getattr(tokenizer, "split_special_tokens", False)

        return cls(encode, marker, enabled=matches_special, **kwargs)

    def __call__(self, text: str) -> list[int]:
        if self._check < 0 or not self._enabled():
            return self._encode(text)
        ids: list[int] = []
        for piece in self._cut(text):
            ids += self._piece(piece)
        if self._check > 0:
            self._check -= 1
            whole = self._encode(text)
            if ids != whole:
                log.warning("token ids of prompt pieces differ from the whole prompt's: reuse turned off")
                self._check = -1
                with self._lock:
                    self._pieces.clear()
                    self._held = 0
                if self._on_mismatch:
                    self._on_mismatch()
                return whole
        return ids

    @property
    def held_ids(self) -> int:
        return self._held

    def _cut(self, text: str) -> list[str]:
        parts = text.split(self._marker)
        return [parts[0], *(self._marker + p for p in parts[1:])] if parts[0] else [self._marker + p for p in parts[1:]]

    def _piece(self, piece: str) -> array:
        with self._lock:
            known = self._pieces.get(piece)
            if known is not None:
                self._pieces.move_to_end(piece)
                self.reused_ids += len(known)
                return known
        known = array("i", self._encode(piece))
        with self._lock:
            self.encoded_ids += len(known)
            if piece not in self._pieces and len(known) <= self._max_ids:
                self._pieces[piece] = known
                self._held += len(known)
                while self._held > self._max_ids:
                    self._held -= len(self._pieces.popitem(last=False)[1])
        return known


def marker_splits_exactly(tokenizer: Any, marker: str) -> bool:
    """Is `marker` an added token the tokenizer cuts its input at, with no effect on the text either side?"""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    added = getattr(backend, "get_added_tokens_decoder", None)
    if added is None:
        return False
    tokens = list(added().values())
    own = next((t for t in tokens if t.content == marker), None)
    if own is None or not cut_on_raw_text(own, backend):  # matched after normalising, or eating whitespace
        return False
    return not any(t.content != marker and _overlap(t.content, marker) for t in tokens)


def _overlap(other: str, marker: str) -> bool:
    """Could a match of `other` in some text cover part of an occurrence of `marker`?"""
    if marker in other or other in marker:
        return True
    return any(other.endswith(marker[:k]) or other.startswith(marker[-k:]) for k in range(1, len(marker)))
