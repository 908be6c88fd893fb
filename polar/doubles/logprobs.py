"""Made-up but deterministic logprobs, in each of vLLM's three layouts (the double has no model)."""

from __future__ import annotations

import hashlib
import itertools
from typing import Any


class FakeLogprobs:
    """Token- and position-dependent values; the sampled token is always rank 1."""

    def __init__(self, tokenizer: Any):
        from transformers.convert_slow_tokenizer import bytes_to_unicode

        self.tokenizer = tokenizer
        self.vocab_size = len(tokenizer)
        self._byte_of = {char: byte for byte, char in bytes_to_unicode().items()}


    def piece(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id], skip_special_tokens=False)

    def _token_bytes(self, token_id: int) -> bytes:
        """The raw bytes a byte-level BPE token stands for (added tokens are plain text)."""
        token = self.tokenizer.convert_ids_to_tokens(token_id)
        if all(char in self._byte_of for char in token):
            return bytes(self._byte_of[char] for char in token)
        return token.encode()

    def _logprob(self, token_id: int, pos: int) -> float:
        """Deterministic, token- and position-dependent values (the double has no model)."""
        h = int.from_bytes(hashlib.blake2b(f"{token_id}:{pos}".encode(), digest_size=4).digest(), "little")
        return -(h % 4000) / 1000.0

    def _ranked(self, token_id: int, pos: int, top: int) -> list[tuple[int, float]]:
        """The sampled token first (rank 1), then made-up, less likely alternatives: `max(top, 1)` in all."""
        best = self._logprob(token_id, pos)
        others = [((token_id + 7919 * k) % self.vocab_size, best - k) for k in range(1, max(top, 1))]
        return [(token_id, best), *others]

    def _chat_entry(self, token_id: int, logprob: float) -> dict[str, Any]:
        raw = self._token_bytes(token_id)
        try:
            text = raw.decode()
        except UnicodeDecodeError:  # part of a character: vLLM reports it empty
            text, raw = "", b""
        return {"token": text, "logprob": logprob, "bytes": list(raw)}

    def chat(self, token_id: int, pos: int, top: int) -> dict[str, Any]:
        ranked = self._ranked(token_id, pos, top)
        tops = [self._chat_entry(t, lp) for t, lp in ranked] if top else []
        return {**self._chat_entry(token_id, ranked[0][1]), "top_logprobs": tops}

    def by_id(self, token_id: int, pos: int, top: int) -> dict[str, Any]:
        ranked = self._ranked(token_id, pos, top)
        tops = [{"token_id": t, "logprob": lp, "rank": rank} for rank, (t, lp) in enumerate(ranked, 1)]
        return {"token_id": token_id, "logprob": ranked[0][1], "rank": 1, "top_logprobs": tops}

    def legacy(self, ids: list[int], top: int) -> dict[str, Any]:
        """/v1/completions' layout: parallel lists, and one {text: logprob} dict per position."""
        pieces = [self.piece(t) for t in ids]
        ranked = [self._ranked(t, i, top) for i, t in enumerate(ids)]
        offsets = [0, *itertools.accumulate(len(p) for p in pieces)][: len(pieces)]
        return {"text_offset": offsets, "token_logprobs": [r[0][1] for r in ranked], "tokens": pieces,
                "top_logprobs": [{self.piece(t): lp for t, lp in r} for r in ranked]}
