"""ids_encoder gives exactly transformers' `encode(text, add_special_tokens=False)` on the real Qwen3.5 vocabulary:
random text with special tokens, marks NFC recombines and emoji; every reference template's rendering; a
tokenizer.json that carries truncation or padding; split_special_tokens; a tokenizer with no Rust backend."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from polar.tokens.encoder import ids_encoder
from tests.tokens.conftest import TEMPLATES

# Pieces a rendered prompt is made of, and the ones tokenizers get wrong: special tokens written as text (and
# half of one), a combining mark NFC folds into the letter before it, CRLF, tabs, runs of spaces, emoji with
# joiners, CJK, digits, code punctuation.
TRICKY = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<think>", "</think>", "<tool_call>", "</tool_call>",
          "<|im_", "e\u0301", "\u0301", "\r\n", "\t", "    ", "👩‍💻", "漢字", "0123456789", "def f(x):", "'s", "\u00a0"]


def _reference(tokenizer, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pieces=st.lists(st.one_of(st.text(st.characters(exclude_categories=["Cs"]), max_size=40),
                                 st.sampled_from(TRICKY)), max_size=30))
def test_random_text_gives_transformers_ids(tokenizer, pieces):
    text = "".join(pieces)
    assert ids_encoder(tokenizer)(text) == _reference(tokenizer, text)


@pytest.mark.parametrize("name", TEMPLATES)
def test_each_templates_rendering_gives_transformers_ids(load, tokenizer, name):
    template = load(name)
    messages = [{"role": "system", "content": "You are a careful coding agent.\n\nBe brief."},
                {"role": "user", "content": "Fix the failing test in tests/test_io.py — it says ‘EOF’ 👀"},
                {"role": "assistant", "content": "I'll look.", "reasoning_content": "Read the test first.",
                 "tool_calls": [{"id": "c1", "type": "function",
                                 "function": {"name": "bash", "arguments": '{"cmd": "pytest -x\\ttests/"}'}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "E   AssertionError: b'\\r\\n' != b'\\n'\n" * 40}]
    tools = [{"type": "function", "function": {"name": "bash", "description": "Run a shell command.",
                                               "parameters": {"type": "object",
                                                              "properties": {"cmd": {"type": "string"}}}}}]
    text = template.render(messages, tools, True)
    assert template.encode(text) == _reference(tokenizer, text)
    assert len(template.encode(text)) > 100


@pytest.fixture
def own_tokenizer(tokenizer_dir):
    """A tokenizer of this test's own: the settings below must not reach the session's."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tokenizer_dir))


def test_truncation_or_padding_in_the_backend_is_cleared_as_transformers_does(own_tokenizer):
    text = "a long line of text that is well past eight tokens, with <|im_end|> in it\n" * 3
    own_tokenizer.backend_tokenizer.enable_truncation(8)
    own_tokenizer.backend_tokenizer.enable_padding(length=400)
    ids = ids_encoder(own_tokenizer)(text)
    assert len(ids) > 40
    assert ids == _reference(own_tokenizer, text)


def test_split_special_tokens_is_followed(own_tokenizer):
    text = "<|im_start|>user\nhi<|im_end|>"
    encode = ids_encoder(own_tokenizer)
    whole = encode(text)
    own_tokenizer.split_special_tokens = True
    split = encode(text)
    assert split == _reference(own_tokenizer, text)
    assert len(split) > len(whole)  # the markers are now spelled out as ordinary text


def test_a_tokenizer_without_a_rust_backend_keeps_its_own_encode():
    class Slow:  # a stand-in: a slow (pure Python) tokenizer has no backend_tokenizer
        def encode(self, text, add_special_tokens=True):
            assert add_special_tokens is False
            return tuple(ord(c) for c in text)

    assert ids_encoder(Slow())("ab") == [97, 98]
