"""The ASCII path (tiktoken's encoder, rank_bpe.py) gives exactly transformers' ids on the real Qwen3.5
vocabulary: every ASCII character at random, text mixing ASCII and non-ASCII lines, added tokens written in
it, every reference template's agent-shaped render. It is not used where it would not be the same
algorithm (merges not in rank order, a pair that joins into a token but is no merge, a probe that differs)."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from polar.tokens import rank_bpe
from polar.tokens.encoder import FAST_FROM_CHARS, IdsEncoder, ids_encoder
from tests.tokens.conftest import TEMPLATES
from tests.tokens.test_encoder import TRICKY

ASCII = "".join(chr(c) for c in range(128))
LINES = ["def handler(request, *, timeout=30):", "    return x  # ✓ done — ok", "tests/test_io.py::test_a PASSED [ 50%]",
         "E   AssertionError: b'\\r\\n' != b'\\n'", "", "  ", "漢字 and ascii", "<|im_end|>", "<tool_response>", "x\r"]


@pytest.fixture(scope="module")
def encode(tokenizer):
    encoder = ids_encoder(tokenizer)
    assert isinstance(encoder, IdsEncoder) and encoder.ascii_path(timeout=120)  # Qwen3.5's vocabulary takes it
    return encoder


def _reference(tokenizer, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


def _long(text: str) -> str:
    """At least FAST_FROM_CHARS: shorter text never takes the ASCII path."""
    return text if len(text) >= FAST_FROM_CHARS else (text + "\n") * (FAST_FROM_CHARS // max(len(text), 1) + 1)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(st.sampled_from(ASCII), min_size=1, max_size=1500))
def test_any_ascii_gives_transformers_ids(tokenizer, encode, text):
    text = _long(text)
    assert encode(text) == _reference(tokenizer, text)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pieces=st.lists(st.one_of(st.sampled_from([*TRICKY, *LINES, "\n", "\n\n", " \n"]),
                                 st.text(st.characters(exclude_categories=["Cs"]), max_size=30),
                                 st.text(st.sampled_from(ASCII), max_size=60)), min_size=1, max_size=60))
def test_mixed_text_with_added_tokens_gives_transformers_ids(tokenizer, encode, pieces):
    text = _long("".join(pieces))
    assert encode(text) == _reference(tokenizer, text)


@pytest.mark.parametrize("name", TEMPLATES)
def test_each_templates_agent_render_gives_transformers_ids(load, tokenizer, encode, name):
    template = load(name)
    output = "\n".join(LINES * 40)
    messages = [{"role": "system", "content": "You are a careful coding agent.\n\nBe brief."},
                {"role": "user", "content": "Fix the failing test in tests/test_io.py — it says ‘EOF’ 👀"},
                {"role": "assistant", "content": "I'll look.", "reasoning_content": "Read the test first.",
                 "tool_calls": [{"id": "c1", "type": "function",
                                 "function": {"name": "bash", "arguments": '{"cmd": "pytest -x\\ttests/"}'}}]},
                {"role": "tool", "tool_call_id": "c1", "content": output},
                {"role": "tool", "tool_call_id": "c1", "content": output.encode("ascii", "ignore").decode()}]
    tools = [{"type": "function", "function": {"name": "bash", "description": "Run a shell command.",
                                               "parameters": {"type": "object",
                                                              "properties": {"cmd": {"type": "string"}}}}}]
    text = template.render(messages, tools, True)
    assert encode(text) == _reference(tokenizer, text)


def test_merges_must_be_every_joining_pair_in_rank_order():
    vocab = {"a": 0, "b": 1, "c": 2, "ab": 3, "abc": 4}
    assert rank_bpe._merges_are_rank_order(vocab, [["a", "b"], ["ab", "c"]])
    assert rank_bpe._merges_are_rank_order(vocab, ["a b", "ab c"])
    assert not rank_bpe._merges_are_rank_order(vocab, [["ab", "c"], ["a", "b"]])  # order is not the ids'
    assert not rank_bpe._merges_are_rank_order({**vocab, "bc": 5}, [["a", "b"], ["ab", "c"]])  # b+c joins, no merge
    assert not rank_bpe._merges_are_rank_order(vocab, [["a", "b"], ["b", "c"]])  # b+c is no token
    assert not rank_bpe._merges_are_rank_order({**vocab, "xb": 5}, [["a", "b"], ["ab", "c"], ["x", "b"]])  # x: no token
    # a merge listed twice makes up the count of a joining pair that has none (a+bc, b+c)
    with_bc = {**vocab, "bc": 5}
    assert not rank_bpe._merges_are_rank_order(with_bc, [["a", "b"], ["ab", "c"], ["ab", "c"], ["ab", "c"]])
    assert rank_bpe._merges_are_rank_order(with_bc, [["a", "b"], ["ab", "c"], ["a", "bc"], ["b", "c"]])


def test_a_probe_that_differs_or_another_layout_leaves_the_tokenizer(tokenizer):
    spec = json.loads(tokenizer.backend_tokenizer.to_str())
    assert rank_bpe._build(spec, lambda text: []) is None  # tiktoken's ids are not these
    nfkc_free = {**spec, "normalizer": {"type": "Lowercase"}}
    assert rank_bpe._build(nfkc_free, lambda text: []) is None
    no_ignore = {**spec, "model": {**spec["model"], "ignore_merges": False}}
    assert rank_bpe._build(no_ignore, lambda text: []) is None


def test_a_long_text_builds_the_path_off_the_callers_time(tokenizer_dir):
    from transformers import AutoTokenizer

    own = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    encoder = ids_encoder(own)
    short = "x = 1\n" * 100
    assert encoder(short) == _reference(own, short) and not encoder._building  # under BUILD_FROM_CHARS
    text = "y = 2\n" * 1000
    assert encoder(text) == _reference(own, text)  # answered by the backend while the path builds
    assert encoder.ascii_path(timeout=120)
    assert encoder(text) == _reference(own, text)
