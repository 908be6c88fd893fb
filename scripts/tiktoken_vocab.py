"""What the scripts that build a real vocabulary from a package's tiktoken ranks share (build_harmony_vocab.py,
build_llama3_vocab.py): the cache folder, the conversion to a Hugging Face tokenizer with the special tokens at
their ids, and the check against the package's own encoder."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from pathlib import Path


def default_out(name: str) -> Path:
    return Path(os.environ.get("POLAR_CACHE") or Path.home() / ".cache" / "polar") / "models" / name


def converted(ranks: Path, pattern: str, specials: list[tuple[int, str]]):
    """A `tokenizers.Tokenizer` of these ranks (a tiktoken file) split by this pattern, with the special tokens
    (id, text) after them; they must follow the ranks, contiguous, or the ids would not be the model's."""
    from tokenizers import AddedToken
    from transformers.convert_slow_tokenizer import TikTokenConverter

    tok = TikTokenConverter(vocab_file=str(ranks), pattern=pattern).converted()
    first = min(i for i, _ in specials)
    if tok.get_vocab_size() != first:
        raise SystemExit(f"{tok.get_vocab_size()} ranks converted, expected {first}")
    if sorted(i for i, _ in specials) != list(range(first, first + len(specials))):
        raise SystemExit("the special ids are not contiguous: the conversion would misnumber them")
    tok.add_tokens([AddedToken(t, normalized=False, special=True) for _, t in sorted(specials)])
    return tok


def differences(hf, reference: Callable[[str], list[int]], texts: list[str]) -> list[str]:
    """Where the built tokenizer's ids are not the reference encoder's, or do not decode back to the text."""
    problems = []
    for text in texts:
        ids = hf.encode(text, add_special_tokens=False)
        if ids != reference(text):
            problems.append(f"ids differ from the package's for {text[:40]!r}")
        if hf.decode(ids) != text:
            problems.append(f"decode(encode(x)) != x for {text[:40]!r}")
    return problems


def main(doc: str, name: str, build: Callable[[Path], None]) -> None:
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--out", type=Path, default=default_out(name))
    build(parser.parse_args().out)
