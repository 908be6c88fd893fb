"""The canonical request as a capture row holds it (`ChatRequest.stored`): exactly pydantic's JSON dump
without None fields, on the six CLIs' and four agents' real requests and on values whose JSON form differs from Python's."""

from __future__ import annotations

import json
import math
from urllib.parse import parse_qsl, urlsplit

import pytest

from polar.canonical import ChatRequest, Message, Sampling, TextPart, Tool, ToolCall
from polar.harnesses import AGENTS, CLIS
from polar.providers import ProviderSet, Sealer
from tests.conftest import REPO


def _json_dump(request: ChatRequest) -> dict:
    return request.model_dump(mode="json", exclude_none=True)


@pytest.mark.parametrize("harness", (*CLIS, *AGENTS), ids=lambda h: h.name)
def test_stored_form_of_real_requests_is_the_json_dump(harness):
    data = json.loads((REPO / "data" / "harness_requests" / f"{harness.name}.json").read_text())
    providers = ProviderSet(Sealer(b"0" * 32))
    for turn in ("first", "later"):
        url = urlsplit(data[turn]["path"])
        route = providers.detect("POST", url.path, dict(parse_qsl(url.query)), data[turn]["headers"])
        request = route.provider.parse(route, data[turn]["body"]).request
        stored = request.stored()
        assert stored == _json_dump(request)
        assert json.dumps(stored, sort_keys=True) == json.dumps(_json_dump(request), sort_keys=True)


def test_stored_form_keeps_json_values_where_python_differs():
    """Non-finite floats (a client may send NaN: Python's json module reads it) in the parts that can hold
    floats, unicode in messages, empty and None fields: the same values as the JSON dump, serialised alike."""
    request = ChatRequest(
        model="m",
        messages=[Message(role="system", content=[TextPart(text="be brief")]),
                  Message(role="assistant", tool_calls=[ToolCall(id="c1", name="f", arguments='{"x": NaN}')]),
                  Message(role="tool", tool_call_id="c1", content=[TextPart(text="é \u2028 \U0001f600")])],
        tools=[Tool(name="f", parameters={"type": "object", "minimum": math.inf, "default": math.nan})],
        sampling=Sampling(temperature=math.inf, top_p=0.5),
        metadata={"score": math.nan, "nested": [1, 2.5, None]},
    )
    stored = request.stored()
    assert json.dumps(stored, sort_keys=True) == json.dumps(_json_dump(request), sort_keys=True)
    assert json.loads(json.dumps(stored)) == json.loads(json.dumps(_json_dump(request)))
