"""Upstream request bodies: orjson for speed, the same JSON as the standard library would send."""

from __future__ import annotations

import json

import numpy as np

from polar.json_values import compact as request_json
from polar.sessions.fingerprints import _digest


def test_token_ids_as_list_or_array_are_the_same_json():
    ids = list(range(0, 300_000, 3))
    as_list = request_json({"token_ids": ids, "sampling_params": {"max_tokens": 5}})
    as_array = request_json({"token_ids": np.asarray(ids, dtype=np.uint32), "sampling_params": {"max_tokens": 5}})
    assert json.loads(as_list) == json.loads(as_array) == {"token_ids": ids, "sampling_params": {"max_tokens": 5}}


def test_integers_past_64_bits_fall_back_to_json():
    body = {"seed": 2**70, "prompt": "é ✓"}
    assert json.loads(request_json(body)) == body


def test_fingerprints_take_integers_past_64_bits():
    assert _digest([{"n": 2**70}]) != _digest([{"n": 2**70 + 1}])
    assert _digest([{"b": 1, "a": 2}]) == _digest([{"a": 2, "b": 1}])  # key order is not what the model saw
