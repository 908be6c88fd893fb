"""Text to token ids exactly as transformers' `encode(text, add_special_tokens=False)` gives them (and vLLM,
which tokenizes a rendered chat prompt that way), without the per-token work the ids do not need.

A token-faithful turn tokenizes everything new in it — at agent size a tool result of thousands of tokens
on every call, the largest share of polar's CPU per call. transformers' fast tokenizers call the Rust
backend's `encode_batch`, which also tracks each token's character offsets; `encode_batch_fast` is the same
pre-tokenization and model without the offsets (the ids are the same; tests/tokens/test_encoder.py checks
it on random text, special tokens included, against transformers' own call). The backend state
transformers sets before each call (special tokens matched, no truncation, no padding) is set the same way
here. A tokenizer without a Rust backend keeps transformers' call.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def ids_encoder(tokenizer: Any) -> Callable[[str], list[int]]:
    """A function text -> ids equal to `list(tokenizer.encode(text, add_special_tokens=False))`."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    fast = getattr(backend, "encode_batch_fast", None)
    if fast is None:
        return lambda text: list(tokenizer.encode(text, add_special_tokens=False))

    def encode(text: str) -> list[int]:
        split = bool(getattr(tokenizer, "split_special_tokens", False))  # transformers' default: False
        if backend.encode_special_tokens != split:
            backend.encode_special_tokens = split
        if backend.truncation is not None:  # a tokenizer.json may carry these; transformers clears them too
            backend.no_truncation()
        if backend.padding is not None:
            backend.no_padding()
        return fast([text], add_special_tokens=False)[0].ids

    return encode
