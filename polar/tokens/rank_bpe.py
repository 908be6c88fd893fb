"""ASCII text to ids through tiktoken's byte-pair encoder, for tokenizers where that is the same algorithm.

Tokenizing what is new in a turn is most of a token-faithful call's CPU at agent size (an 8 KB tool
result: ~2,900 tokens, ~1.0-1.6 µs a token in transformers' Rust backend). tiktoken's encoder does the same
byte-level BPE 3-4x faster. They give the same ids when:

- the model is a byte-level BPE whose merges are exactly every pair of tokens that joins into a token, in
  the order of the joined token's id: merging the pair of lowest merge index (transformers) is then merging
  the pair whose join has the lowest rank (tiktoken). `ignore_merges` (a word that is a token is that
  token) is what tiktoken does too. Qwen2/2.5/3/3.5 vocabularies are built this way (checked here, per
  tokenizer, not assumed);
- the pre-tokenizer is one regex split followed by the byte-level mapping, so tiktoken can split with the
  same regex;
- the text is ASCII: the regex's classes (\\p{L}, \\s...) then mean the same in both regex engines whatever
  their Unicode versions, and NFC changes nothing.

Added tokens are cut out before (as the tokenizer does) and text that is not ASCII goes to the tokenizer
(encoder.py cuts mixed text into lines). A fixed corpus is encoded both ways when the encoder is built;
any difference, or any condition above unmet, leaves everything to the tokenizer.
"""

from __future__ import annotations

import json
import logging
import random
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger("polar.tokens")

_built: dict[tuple, Callable[[str], list[int]] | None] = {}  # per tokenizer: building takes ~2 s
_lock = threading.Lock()


def ascii_encoder(tokenizer: Any, reference: Callable[[str], list[int]]) -> Callable[[str], list[int]] | None:
    """text (ASCII, no added tokens) -> ids equal to `reference`'s, or None when that cannot be guaranteed."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None
    key = (getattr(tokenizer, "name_or_path", None), backend.get_vocab_size(with_added_tokens=True),
           tuple(sorted(t.content for t in backend.get_added_tokens_decoder().values())))
    with _lock:
        if key not in _built:
            try:
                _built[key] = _build(json.loads(backend.to_str()), reference)
            except Exception as exc:  # an unexpected tokenizer layout: the tokenizer's own path only
                log.info("tiktoken's encoder not used for this tokenizer: %s", exc)
                _built[key] = None
        return _built[key]


def _build(spec: dict[str, Any], reference: Callable[[str], list[int]]) -> Callable[[str], list[int]] | None:
    import tiktoken
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    model, pre = spec.get("model") or {}, spec.get("pre_tokenizer") or {}
    if (model.get("type") != "BPE" or not model.get("ignore_merges") or model.get("byte_fallback")
            or model.get("dropout") or model.get("continuing_subword_prefix") or model.get("end_of_word_suffix")):
        return None
    steps = pre.get("pretokenizers") if pre.get("type") == "Sequence" else None
    if not steps or len(steps) != 2:
        return None
    split, level = steps
    if (split.get("type") != "Split" or "Regex" not in (split.get("pattern") or {})
            or split.get("behavior") != "Isolated" or split.get("invert")
            or level.get("type") != "ByteLevel" or level.get("use_regex") or level.get("add_prefix_space")):
        return None
    normalizer = spec.get("normalizer")
    if normalizer is not None and normalizer.get("type") not in ("NFC", "NFKC", "NFD", "NFKD"):
        return None  # unicode normal forms leave ASCII as it is; others (lowercase, replace) may not
    vocab: dict[str, int] = model["vocab"]
    if not _merges_are_rank_order(vocab, model["merges"]):
        return None
    to_byte = {char: byte for byte, char in bytes_to_unicode().items()}
    ranks = {bytes(to_byte[c] for c in token): rank for token, rank in vocab.items()}
    encoding = tiktoken.Encoding("polar-rank-bpe", pat_str=split["pattern"]["Regex"], mergeable_ranks=ranks,
                                 special_tokens={})
    encode = encoding.encode_ordinary
    for text in _probe_corpus():
        if encode(text) != reference(text):
            log.warning("tiktoken's encoder differs from the tokenizer on ASCII text: not used")
            return None
    return encode


def _merges_are_rank_order(vocab: dict[str, int], merges: list) -> bool:
    """Every merge joins two tokens into a token, each merge once, in the joined tokens' id order; and there are
    as many merges as pairs of tokens joining into a token — distinct joining pairs as many as all of them are
    all of them (counting, not a set of 500k pairs: this check is most of a build's time)."""
    last, cuts = -1, set()  # cuts: where the merges of the token of id `last` split it
    for merge in merges:
        a, b = merge if isinstance(merge, list) else merge.split(" ", 1)
        rank = vocab.get(a + b)
        if rank is None or rank < last or a not in vocab or b not in vocab:
            return False
        if rank != last:
            last, cuts = rank, set()
        if len(a) in cuts:
            return False  # the same merge twice
        cuts.add(len(a))
    joining = sum(1 for token in vocab for k in range(1, len(token)) if token[:k] in vocab and token[k:] in vocab)
    return joining == len(merges)


def _probe_corpus() -> list[str]:
    """ASCII the two encoders must agree on: every character, contractions, runs of spaces and line ends, code."""
    rng = random.Random(0)
    every = "".join(chr(c) for c in range(128))
    pieces = [" ", "  ", "\n", "\r\n", "\t", "'s", "'T", "'ll", "'Re", "don't", "x = 1", "12345", "    def f(a, b):",
              "HTTP/1.1 200 OK", "ABCdef", "__init__", "a\x0b\x0c\x1c\x1f b", "!!", "...", "\n\n\n", "  \n  \n", "end   "]
    corpus = [every, every[::-1], "\n".join(pieces)]
    for _ in range(300):
        corpus.append("".join(rng.choice(pieces) if rng.random() < 0.5 else rng.choice(every)
                              for _ in range(rng.randrange(1, 40))))
    return corpus
