"""Text to token ids exactly as transformers' `encode(text, add_special_tokens=False)` gives them (and vLLM,
which tokenizes a rendered chat prompt that way), without the per-token work the ids do not need.

A token-faithful turn tokenizes everything new in it — at agent size a tool result of thousands of tokens
on every call, the largest share of polar's CPU per call. transformers' fast tokenizers call the Rust
backend's `encode_batch`, which also tracks each token's character offsets; `encode_batch_fast` is the same
pre-tokenization and model without the offsets (the ids are the same; tests/tokens/test_encoder.py checks
it on random text, special tokens included, against transformers' own call). The backend state
transformers sets before each call (special tokens matched, no truncation, no padding) is set the same way
here. A tokenizer without a Rust backend keeps transformers' call.

ASCII text goes through tiktoken's encoder where that is the same BPE (rank_bpe.py: 3-4x faster). The text
is cut as the tokenizer cuts it first, at its added tokens (leftmost, then longest); each piece between
them is ASCII (tiktoken), or cut into lines where no pre-token can span the cut (after a line end, before
a printable ASCII character), runs of ASCII lines to tiktoken and the others to the backend.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from typing import Any

from polar.tokens.rank_bpe import ascii_encoder

FAST_FROM_CHARS = 256  # shorter text: the cutting would cost more than it saves
BUILD_FROM_CHARS = 4096  # the first text this long builds the ASCII path (~4 s of CPU once, in a thread)
_LINES = re.compile(r"(?<=\n)(?=[!-~])")  # no pre-token of a one-regex byte-level BPE spans such a cut


def ids_encoder(tokenizer: Any) -> Callable[[str], list[int]]:
    """A function text -> ids equal to `list(tokenizer.encode(text, add_special_tokens=False))`."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if getattr(backend, "encode_batch_fast", None) is None:
        return lambda text: list(tokenizer.encode(text, add_special_tokens=False))
    return IdsEncoder(tokenizer, backend)


class IdsEncoder:
    """The backend's ids; ASCII through tiktoken once that path is built (only processes that see agent-sized
    text pay for building it, and never on the caller's time: until it is ready the backend answers)."""

    def __init__(self, tokenizer: Any, backend: Any):
        self._tokenizer, self._backend = tokenizer, backend
        self._by_backend: Callable[[str], list[int]] = lambda text: backend.encode_batch_fast(
            [text], add_special_tokens=False)[0].ids
        self._ascii: Callable[[str], list[int]] | None = None
        self._built = threading.Event()
        self._building = False

    def __call__(self, text: str) -> list[int]:
        split = _prepare(self._tokenizer, self._backend)
        if not split and len(text) >= FAST_FROM_CHARS:
            if self._ascii is not None:
                return self._ascii(text)
            if len(text) >= BUILD_FROM_CHARS:
                self.start_building()
        return self._by_backend(text)

    def start_building(self) -> None:
        """Build the ASCII path in a thread, if not built or under way (a proxy does so as it starts)."""
        if not self._building:
            self._building = True
            threading.Thread(target=self._build, name="polar-ascii-bpe", daemon=True).start()

    def ascii_path(self, timeout: float | None = None) -> bool:
        """Build the ASCII path now (or wait for the build under way); whether it is in use."""
        if not self._building:
            self._building = True
            self._build()
        self._built.wait(timeout)
        return self._ascii is not None

    def _build(self) -> None:
        try:
            self._ascii = _ascii_path(self._tokenizer, self._backend, self._by_backend)
        finally:
            self._built.set()


def _prepare(tokenizer: Any, backend: Any) -> bool:
    """The backend state transformers sets before encoding; whether special tokens are split as text."""
    split = bool(getattr(tokenizer, "split_special_tokens", False))  # transformers' default: False
    if backend.encode_special_tokens != split:
        backend.encode_special_tokens = split
    if backend.truncation is not None:  # a tokenizer.json may carry these; transformers clears them too
        backend.no_truncation()
    if backend.padding is not None:
        backend.no_padding()
    return split


def cut_on_raw_text(token: Any, backend: Any) -> bool:
    """Does the tokenizer cut its input at this added token on the raw text, leaving the text either side as it is?"""
    return not (token.lstrip or token.rstrip or token.single_word or (token.normalized and backend.normalizer is not None))


def _ascii_path(tokenizer: Any, backend: Any, by_backend: Callable[[str], list[int]]) -> Callable[[str], list[int]] | None:
    _prepare(tokenizer, backend)
    added = list(backend.get_added_tokens_decoder().items())
    if not all(cut_on_raw_text(t, backend) for _, t in added):
        return None  # matched on normalised text, or eating whitespace: leave the cutting to the tokenizer
    ordinary = ascii_encoder(tokenizer, by_backend)
    if ordinary is None:
        return None
    ids_of = {t.content: i for i, t in added}
    if ids_of:
        tokens = sorted(ids_of, key=len, reverse=True)  # at one position the longest wins, as the tokenizer's
        cut: Callable[[str], list[str]] = re.compile("(" + "|".join(map(re.escape, tokens)) + ")").split
    else:
        def cut(text: str) -> list[str]:
            return [text]

    def ascii_ids(text: str) -> list[int]:
        ids: list[int] = []
        for k, piece in enumerate(cut(text)):
            if k % 2:  # an added token
                ids.append(ids_of[piece])
            elif piece.isascii():
                ids += ordinary(piece)
            elif piece:
                ids += _mixed(piece, ordinary, by_backend)
        return ids

    return ascii_ids


def _mixed(text: str, ordinary: Callable[[str], list[int]], backend: Callable[[str], list[int]]) -> list[int]:
    """Text with some non-ASCII: runs of ASCII lines to tiktoken, the other lines to the backend."""
    ids: list[int] = []
    run: list[str] = []
    run_ascii = True
    for line in _LINES.split(text):
        line_ascii = line.isascii()
        if run and line_ascii != run_ascii:
            ids += (ordinary if run_ascii else backend)("".join(run))
            run = []
        run.append(line)
        run_ascii = line_ascii
    if run:
        ids += (ordinary if run_ascii else backend)("".join(run))
    return ids
