"""Request bodies → JSON: the nesting limit on the decoded value agrees with a count on the text."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from polar.errors import GatewayError
from polar.gateway.body import decode, decode_json, nests_deeper

json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.text(alphabet="[]{}\"\\ab"),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner,
                                                                                         max_size=3),
                           max_leaves=40)


def depth(value) -> int:
    if isinstance(value, dict):
        return 1 + max((depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((depth(v) for v in value), default=0)
    return 0


@given(json_values, st.integers(min_value=0, max_value=8))
def test_nests_deeper_is_the_depth_of_containers(value, limit):
    assert nests_deeper(value, limit) == (depth(value) > limit)


def test_brackets_inside_strings_do_not_count():
    text = json.dumps({"a": "[" * 500 + "{" * 500})
    assert decode_json(text.encode(), "application/json", 1 << 20, max_depth=2) == json.loads(text)


@pytest.mark.parametrize("levels", [129, 5000, 200_000])
def test_too_deep_is_a_client_error_at_any_depth(levels):
    body = b"[" * levels + b"]" * levels  # 200k levels: past the decoder's own recursion limit
    with pytest.raises(GatewayError, match="nests JSON too deeply"):
        decode_json(body, "application/json", 1 << 20)


def test_exactly_at_the_limit_is_served():
    body = b"[" * 128 + b"]" * 128
    assert nests_deeper(decode_json(body, None, 1 << 20), 127)


def test_a_bare_null_is_a_value_not_a_nesting_error():
    assert decode_json(b"null", None, 1 << 20) is None  # refused later, as "must be a JSON object"


any_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.integers(min_value=2**62, max_value=2**80)
    | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=4),
    max_leaves=30)


@given(any_json)
def test_decoded_as_json_decodes_it(value):
    """orjson decodes where it can; the value is always `json`'s, big integers digit for digit."""
    text = json.dumps(value, ensure_ascii=False)
    assert decode_json(text.encode(), None, 1 << 20) == json.loads(text)
    assert json.dumps(decode_json(text.encode(), None, 1 << 20)) == json.dumps(json.loads(text))


@pytest.mark.parametrize("number", ["18446744073709551616", "-9223372036854775809", "1" + "0" * 30,
                                    "9223372036854775808", "123456789012345678901234567890"])
def test_integers_past_64_bits_keep_every_digit(number):
    body = ('{"input": {"n": %s, "deep": [[{"m": %s}]]}}' % (number, number)).encode()
    value = decode_json(body, "application/json", 1 << 20)
    assert value["input"]["n"] == int(number) and type(value["input"]["n"]) is int
    assert value["input"]["deep"][0][0]["m"] == int(number)


@pytest.mark.parametrize("body", [b'{"t": NaN}', b'\xef\xbb\xbf{"a": 1}', '{"a": "é"}'.encode("utf-16"), b'{"x": 1e400}',
                                  b'{"x": 1e19}'])
def test_what_orjson_refuses_json_still_takes(body):
    text = body.decode(json.detect_encoding(body))
    assert json.dumps(decode_json(body, None, 1 << 20)) == json.dumps(json.loads(text))


def test_a_lone_surrogate_is_refused_either_way():
    with pytest.raises(GatewayError, match="unpaired UTF-16 surrogate"):
        decode_json(b'{"a": "\\ud800"}', None, 1 << 20)
    assert decode_json(b'{"a": "\\ud83d\\ude00"}', None, 1 << 20) == {"a": "\U0001f600"}


@pytest.mark.parametrize("body", [b'{"t": NaN}', b'{"t": [Infinity]}', b'{"n": 18446744073709551616}', b'\xef\xbb\xbf{}'])
def test_only_what_orjson_decoded_is_exact(body):
    """The session history compares items by the JSON text orjson writes (providers/history.py): NaN and
    infinity would write as null, and big integers not at all, so such bodies are not exact."""
    assert decode(body, None, 1 << 20)[1] is False
    assert decode(b'{"t": [1, 1.5, true, null, "x"]}', None, 1 << 20) == ({"t": [1, 1.5, True, None, "x"]}, True)
