"""read_chat_answer: an answer's prompt ids read past the session's previous ids are exactly the full parse's."""

from __future__ import annotations

import json

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from polar.errors import GatewayError
from polar.upstream import prompt_ids
from polar.upstream.prompt_ids import ids_past_known, read_chat_answer

token = st.integers(min_value=0, max_value=2**32 - 1)


@pytest.fixture(autouse=True)
def compare_short_texts_too(monkeypatch):
    """The comparison path at every size: below COMPARE_FROM_BYTES polar parses the ids whole (faster there),
    which would leave this module's small generated cases testing only the plain parse."""
    monkeypatch.setattr(prompt_ids, "COMPARE_FROM_BYTES", 0)
small_token = st.integers(min_value=0, max_value=200)  # short numbers: digit boundaries shift often


def answer(prompt_ids, *, compact=True, key_first=False, content="hi") -> bytes:
    """A vLLM chat completion with token ids, written as vLLM's server writes it (or with spaces)."""
    body = {"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "m"}
    choices = [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop",
                "token_ids": [5, 6]}]
    if key_first:
        body["prompt_token_ids"] = prompt_ids
        body["choices"] = choices
    else:
        body["choices"] = choices
        body["prompt_token_ids"] = prompt_ids
    body["usage"] = {"prompt_tokens": len(prompt_ids) if isinstance(prompt_ids, list) else 0}
    return json.dumps(body, separators=(",", ":") if compact else (", ", ": ")).encode()


def check(raw: bytes, known) -> None:
    expected = json.loads(raw)
    got = read_chat_answer(raw, None if known is None else np.asarray(known, dtype=np.uint32))
    ids = got.pop("prompt_token_ids")
    assert ids.dtype == np.dtype("<u4")
    assert ids.tolist() == expected.pop("prompt_token_ids")
    assert got == expected


@st.composite
def edited(draw, tokens=small_token):
    """The previous turn's ids and the next prompt: kept to some point (a template re-rendering the answer),
    edited anywhere (a compacted history), then new ids appended."""
    known = draw(st.lists(tokens, max_size=300))
    keep = draw(st.integers(min_value=0, max_value=len(known)))
    new = list(known[:keep])
    for _ in range(draw(st.integers(min_value=0, max_value=3))):
        if new:
            new[draw(st.integers(min_value=0, max_value=len(new) - 1))] = draw(tokens)
    return known, new + draw(st.lists(tokens, max_size=50))


@settings(max_examples=400, deadline=None)
@given(edited(), st.booleans(), st.booleans())
def test_the_ids_read_past_the_previous_turn_are_the_full_parse(case, compact, key_first):
    known, new = case
    check(answer(new, compact=compact, key_first=key_first), known)


@settings(max_examples=200, deadline=None)
@given(edited(token))
def test_any_uint32_ids(case):
    known, new = case
    check(answer(new), known)


@pytest.mark.parametrize(("known", "new"), [
    ([12, 3], [123]), ([123], [12, 3]), ([1, 2], [1, 2]), ([1, 2], [1]), ([1, 2], [1, 20]), ([1, 20], [1, 2]),
    ([], [7]), ([7], []), ([1, 2, 3], [1, 2, 3, 4]), ([10, 2], [1, 0, 2]),
])
def test_digit_boundaries(known, new):
    check(answer(new), known)
    assert ids_past_known(orjson.dumps(new), np.asarray(known, np.uint32)).tolist() == new


def test_a_whole_first_turn_and_no_session():
    check(answer(list(range(1000))), None)


def test_a_nested_key_of_the_same_name_is_not_taken_for_the_prompt():
    raw = json.dumps({"kv_transfer_params": {"prompt_token_ids": [9, 9]}, "choices": [], "prompt_token_ids": [1, 2, 3]},
                     separators=(",", ":")).encode()
    assert read_chat_answer(raw, np.asarray([1, 2], np.uint32))["prompt_token_ids"].tolist() == [1, 2, 3]
    nested_only = b'{"choices":[],"x":{"prompt_token_ids":[9]}}'
    assert "prompt_token_ids" not in read_chat_answer(nested_only, None)


def test_the_key_inside_a_text_is_text():
    raw = answer([1, 2, 3], content='"prompt_token_ids":[4,5]')
    check(raw, [1, 2])


@pytest.mark.parametrize("bad", [[1, -2], [1, 2.5], [1, 2**40], [1, "2"], [1, None], [1, [2]]])
def test_ids_that_are_not_token_ids_are_an_upstream_error(bad):
    with pytest.raises(GatewayError) as err:
        read_chat_answer(answer(bad), np.asarray([1], np.uint32))
    assert err.value.kind == "upstream_error" and "prompt_token_ids" in str(err.value)


def test_answers_without_prompt_ids_or_with_null_read_as_json():
    assert read_chat_answer(b'{"choices":[],"prompt_token_ids":null}', None) == {"choices": [], "prompt_token_ids": None}
    assert read_chat_answer('{"choices":[{"delta":{"content":"x"}}]}', np.asarray([1], np.uint32)) == {
        "choices": [{"delta": {"content": "x"}}]}
    # What orjson refuses and json reads (vLLM's -Infinity logprob) still reads, the ids included.
    raw = b'{"choices":[{"logprobs":{"content":[{"logprob":-Infinity}]}}],"prompt_token_ids":[1,2,3]}'
    got = read_chat_answer(raw, np.asarray([1, 2], np.uint32))
    assert got["prompt_token_ids"].tolist() == [1, 2, 3]


def test_a_streamed_first_chunk_as_text():
    chunk = answer([4, 5, 6]).decode()
    assert read_chat_answer(chunk, np.asarray([4, 5], np.uint32))["prompt_token_ids"].tolist() == [4, 5, 6]


def test_an_upstream_writing_spaces_after_commas_is_read_past_its_known_ids_too():
    known = np.arange(1000, 3000, dtype=np.uint32)
    text = json.dumps(known.tolist() + [7]).encode()  # json's default: `1, 2`
    assert ids_past_known(text, known).tolist() == known.tolist() + [7]
    assert ids_past_known(b"[1 , 2]", np.asarray([1, 2], np.uint32)).tolist() == [1, 2]


@pytest.mark.parametrize("separators", [(",", ":"), (", ", ": ")])
def test_only_the_ids_past_the_shared_ones_are_parsed(monkeypatch, separators):
    import polar.upstream.prompt_ids as module

    parsed = []
    monkeypatch.setattr(module, "token_array", lambda ids, what: parsed.append(len(ids)) or np.asarray(ids, np.uint32))
    known = np.arange(5000, 25_000, dtype=np.uint32)
    raw = json.dumps({"choices": [], "prompt_token_ids": known[:-1].tolist() + [1, 2, 3]}, separators=separators).encode()
    assert read_chat_answer(raw, known)["prompt_token_ids"].tolist() == known[:-1].tolist() + [1, 2, 3]
    assert parsed == [3]  # the three ids past the shared ones


@pytest.mark.parametrize("n", [10, 500, 5000])
def test_short_id_texts_are_parsed_whole_and_long_ones_past_the_known_ids(monkeypatch, n):
    monkeypatch.setattr(prompt_ids, "COMPARE_FROM_BYTES", 8 * 1024)  # as shipped
    parsed = []
    monkeypatch.setattr(prompt_ids, "token_array", lambda ids, what: parsed.append(len(ids)) or np.asarray(ids, np.uint32))
    known = np.arange(5000, 5000 + n, dtype=np.uint32)
    raw = answer(known.tolist() + [1, 2])
    assert read_chat_answer(raw, known)["prompt_token_ids"].tolist() == known.tolist() + [1, 2]
    whole = len(orjson.dumps(known.tolist() + [1, 2])) < prompt_ids.COMPARE_FROM_BYTES
    # past the known ids: the last known one (not yet followed by a comma there) and the two new ones
    assert parsed == ([n + 2] if whole else [3]) and whole == (n < 5000)
