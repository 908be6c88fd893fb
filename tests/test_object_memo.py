"""ObjectMemo: a value per object (by identity), computed once while kept; what the gateway derives from the
messages a session's calls share (fingerprints, stored forms) equals computing it afresh."""

from __future__ import annotations

import gc

from polar.canonical import ChatRequest, Message, TextPart, ToolCall, stored_form
from polar.object_memo import ObjectMemo
from polar.sessions.fingerprints import _fingerprint, message_fingerprint


def test_computed_once_per_object_and_never_confused_by_a_reused_id():
    calls = []
    memo = ObjectMemo(lambda obj: calls.append(obj) or len(calls), size=3)
    a, b = [1], [1]  # equal, not the same
    assert (memo(a), memo(a), memo(b)) == (1, 1, 2)
    del a
    gc.collect()
    assert memo([1]) == 3  # a new object: its own value (the entry holds `a`, so no new object takes its id)
    memo([2])  # a fourth object: all let go, then this one kept
    assert len(memo) == 1 and memo(b) == 5


def test_fingerprints_and_stored_forms_are_those_of_the_message():
    messages = [Message(role="user", content=[TextPart(text="hi")]),
                Message(role="assistant", tool_calls=[ToolCall(id="c", name="run", arguments='{"a": 1}')]),
                Message(role="tool", tool_call_id="c", name="run", content=[TextPart(text="out")])]
    request = ChatRequest(model="m", messages=messages)
    for message in messages:
        assert message_fingerprint(message) == _fingerprint(message) == message_fingerprint(message)
        assert stored_form(message) == message.model_dump(exclude_none=True)
    assert request.stored()["messages"] == request.model_dump(exclude_none=True)["messages"]
    assert request.stored()["messages"][0] is request.stored()["messages"][0]  # shared, once per message
