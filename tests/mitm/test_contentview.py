"""The "polar" contentview's text: what mitmweb shows for a captured call.

Rendered through mitmproxy's own `prettify_message`, the function mitmweb's content endpoint calls.
"""

from __future__ import annotations

import contextlib
import json
import math
import uuid

import openai
import pytest
from mitmproxy import contentviews, ctx
from mitmproxy.test import taddons, tflow

from polar.mitm.contentview import LOW_MARK, PolarContentview
from tests.support.captures import Recorder


class _Gateway:
    """What the view reads from the addon's gateway: its capture reader, and a backend with or without a tokenizer."""

    def __init__(self, recorder: Recorder, backend: object = None):
        self.reader, self.backend = recorder.reader, backend


def _registry(view: PolarContentview) -> contentviews.ContentviewRegistry:
    registry = contentviews.ContentviewRegistry()
    registry.register(contentviews.raw)
    registry.register(view)
    return registry


def _flow(meta: dict | None):
    flow = tflow.tflow(resp=True)
    if meta is not None:
        flow.metadata["polar"] = meta
    return flow


@contextlib.contextmanager
def _test_master():
    """mitmproxy's test context, undone afterwards: its Master rebinds mitmproxy's module-global
    context, and the in-process proxy of the session-wide `stack` fixture runs on the real one."""
    saved = {name: getattr(ctx, name) for name in ("master", "options", "log") if hasattr(ctx, name)}
    try:
        with taddons.context() as context:
            yield context
    finally:
        for name, value in saved.items():
            setattr(ctx, name, value)


def _show(view: PolarContentview, flow) -> contentviews.ContentviewResult:
    with _test_master():
        return contentviews.prettify_message(flow.response, flow, view_name="polar", registry=_registry(view))


def _capture(rec: Recorder, session: str, prompt: list[int], completion: list[int], logprobs: list[float],
             result: dict) -> int:
    """A call as the gateway writes it; its call id is c%04d of its row id (a fresh database)."""
    return rec.call(session, prompt, completion, messages=[{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
                    finish=result["finish_reason"], mode=result.get("prompt_mode", "chat-template"), logprobs=logprobs,
                    result=result, provider="openai_chat")


def test_ids_only_marks_and_sorts_low_probability_tokens(tmp_path):
    """Chat-template mode (no tokenizer): the store's ids and logprobs, low ones marked and listed first."""
    store = Recorder(tmp_path / "c.db")
    result = {"id": "x", "model": "tiny", "created": 0, "content": "Hello", "finish_reason": "stop",
              "usage": {"prompt_tokens": 3, "completion_tokens": 3}, "prompt_mode": "chat-template"}
    first = _capture(store, "s-ids", [1, 2, 3], [10, 11, 12], [-0.5, -3.0, -0.25], result)
    second = _capture(store, "s-ids", [1, 2, 3, 10, 11, 12, 4], [13, 14], [-0.125, -2.5], result)
    view = PolarContentview(lambda: _Gateway(store), low_prob=0.1)

    shown = _show(view, _flow({"row": second, "call_id": f"c{second:04d}", "session": "s-ids"}))
    assert shown.view_name == "polar"
    lines = shown.text.splitlines()
    assert lines[0].split() == ["session", "s-ids", "(2", "calls,", "1", "trajectory)"]
    assert f"trajectory  s-ids#{first} · prefix-merge · turn 2 of 2" in lines
    assert "            this call: [6, 7) new prompt, [7, 9) sampled" in lines
    assert "count       2, mean logprob -1.312" in lines
    assert f"low         1 below p 0.1 (logprob < -2.30), marked {LOW_MARK}" in lines
    assert "text        ids only (no tokenizer: chat-template mode)" in lines
    lowest = lines.index("lowest probability first (2 of 2)")
    in_order = lines.index("in order")
    assert [line.split() for line in lines[lowest + 2 : lowest + 4]] == [
        ["▶", "low", "1", "14", "-2.500", "0.082"], ["0", "13", "-0.125", "0.882"]]
    assert [line.split() for line in lines[in_order + 2 : in_order + 4]] == [
        ["0", "13", "-0.125", "0.882"], ["▶", "low", "1", "14", "-2.500", "0.082"]]
    assert '"text": "hi"' in shown.text.split("── canonical request")[1]
    store.close()


def test_tool_call_through_the_gateway_decodes_the_captured_tokens(stack):
    """Token-faithful mode: a tool-calling answer, its tokens decoded with the served model's tokenizer."""
    session = f"cv-tools-{uuid.uuid4().hex[:6]}"
    stack.script(steps=[{"reasoning": "Look at the file first.",
                         "tool_calls": [{"name": "read_file", "arguments": {"path": "src/app.py"}}]}])
    client = openai.OpenAI(base_url=f"{stack.url}/v1", api_key="k", default_headers={"x-polar-session": session})
    tools = [{"type": "function", "function": {"name": "read_file", "parameters": {
        "type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}}]
    answer = client.chat.completions.create(model="tiny", tools=tools,
                                            messages=[{"role": "user", "content": "What is in src/app.py?"}])
    (call,) = answer.choices[0].message.tool_calls
    row = stack.rows(session)[0]
    gateway = stack.proxy.addon.gateway
    view = PolarContentview(lambda: gateway)

    text = _show(view, _flow({"row": row["id"], "call_id": row["call_id"], "session": session})).text
    lines = text.splitlines()
    assert f"session     {session}  (1 call, 1 trajectory)" in lines
    assert f"trajectory  {session}#{row['id']} · prefix-merge · turn 1 of 1" in lines
    assert "finish      tool_calls" in lines
    assert "versions    policy -, weights default" in lines  # no trainer's step given; the double's weight label
    assert f"tool call   read_file  ({call.id})" in lines
    assert "reasoning" in lines and "            Look at the file first." in lines
    assert "text        decoded with the served model's tokenizer" in lines
    # Every sampled token, in order, with the id and logprob the store holds and the tokenizer's text.
    tokenizer = gateway.backend.template.tokenizer
    table = lines[lines.index("in order") + 2 :][: len(row["completion_ids"])]
    for pos, (line, token_id, logprob) in enumerate(zip(table, row["completion_ids"], row["completion_logprobs"])):
        piece = json.dumps(tokenizer.decode([token_id], skip_special_tokens=False), ensure_ascii=False)
        assert line.startswith(LOW_MARK if logprob < math.log(0.1) else " " * len(LOW_MARK)), line
        assert f"{pos:>5}  {token_id:>7}  {piece[:20]}" in line and f"{logprob:.3f}" in line, line
    assert any('"<tool_call>"' in line for line in table)
    low = sum(lp < math.log(0.1) for lp in row["completion_logprobs"])
    assert sum(line.startswith(LOW_MARK) for line in table) == low > 0
    assert '"name": "read_file"' in text.split("── canonical request")[1]


def test_other_flows_are_refused_with_a_reason(tmp_path):
    store = Recorder(tmp_path / "c.db")
    result = {"id": "x", "model": "tiny", "created": 0, "finish_reason": "stop"}
    row = _capture(store, "s", [1], [2], [-0.1], result)
    view = PolarContentview(lambda: _Gateway(store))
    with _test_master():
        plain = _flow(None)
        side_call = _flow({"session": "s", "kind": "side-call"})
        ours = _flow({"row": row, "call_id": f"c{row:04d}"})
        # Never picked by "auto" (raw is 0.1), offered only for polar's model calls.
        assert view.render_priority(b"", contentviews.Metadata(flow=plain)) < 0
        assert view.render_priority(b"", contentviews.Metadata(flow=side_call)) < 0
        assert 0 <= view.render_priority(b"", contentviews.Metadata(flow=ours)) < contentviews.raw.render_priority(b"", None)
    assert "not a model call answered by polar" in _show(view, plain).text
    other_db = _show(view, _flow({"row": row, "call_id": "from-another-db"})).text
    assert f"holds call c{row:04d}, not this flow's from-another-db" in other_db
    assert f"capture row 99 is not in {store.reader.path}" in _show(view, _flow({"row": 99, "call_id": "c"})).text
    assert "not configured" in _show(PolarContentview(lambda: None), ours).text
    with pytest.raises(ValueError, match="between 0 and 1"):
        PolarContentview(lambda: None, low_prob=0)
    store.close()


def test_a_call_without_logprobs_says_so_instead_of_numbers(tmp_path):
    store = Recorder(tmp_path / "c.db")
    result = {"id": "x", "model": "tiny", "created": 0, "content": "Hi", "finish_reason": "stop",
              "usage": {"prompt_tokens": 3, "completion_tokens": 2}, "prompt_mode": "chat-template"}
    first = _capture(store, "s", [1, 2, 3], [10, 11], [-0.5, -3.0], result)
    bare = store.call("s", [1, 2, 3, 10, 11, 4], [12, 13], messages=[{"role": "user", "content": [{"text": "hi"}]}],
                      result=result, provider="openai_chat", no_logprobs=True)
    view = PolarContentview(lambda: _Gateway(store), low_prob=0.1)

    lines = _show(view, _flow({"row": bare, "call_id": f"c{bare:04d}"})).text.splitlines()
    assert "logprobs    none for this call; 1 of 2 turns without" in lines
    assert "count       2, no logprobs (the upstream returned none)" in lines
    assert not any("mean logprob" in line or "lowest probability" in line or LOW_MARK in line for line in lines)
    in_order = lines.index("in order")
    assert lines[in_order + 1].split() == ["pos", "id"]  # no logprob or p column to leave empty
    assert [line.split() for line in lines[in_order + 2 : in_order + 4]] == [["0", "12"], ["1", "13"]]

    lines = _show(view, _flow({"row": first, "call_id": f"c{first:04d}"})).text.splitlines()
    assert "logprobs    this call has them; 1 of 2 turns without" in lines
    assert "count       2, mean logprob -1.750" in lines
    store.close()


def test_failed_call_shows_the_error_and_no_trajectory(tmp_path):
    store = Recorder(tmp_path / "c.db")
    row_id = store.fail("s", error="vLLM answered 500", provider="anthropic")
    text = _show(PolarContentview(lambda: _Gateway(store)), _flow({"row": row_id, "call_id": f"c{row_id:04d}"})).text
    lines = text.splitlines()
    assert "status      error: upstream: vLLM answered 500" in lines
    assert "trajectory  none: this call sampled no tokens" in lines
    assert "none: the call produced no result" in lines
    store.close()


def test_a_session_is_read_once_until_it_changes(tmp_path, monkeypatch):
    """Viewing call after call of one session re-reads it only when a call was added or finished."""
    store = Recorder(tmp_path / "c.db")
    result = {"id": "x", "model": "tiny", "created": 0, "content": "Hi", "finish_reason": "stop",
              "usage": {"prompt_tokens": 3, "completion_tokens": 2}, "prompt_mode": "chat-template"}
    first = _capture(store, "s-cache", [1, 2, 3], [10, 11], [-0.5, -0.5], result)
    reads = []
    calls = store.reader.calls
    monkeypatch.setattr(store.reader, "calls", lambda session=None, **kw: reads.append(session) or calls(session, **kw))
    view = PolarContentview(lambda: _Gateway(store))
    flow = _flow({"row": first, "call_id": f"c{first:04d}", "session": "s-cache"})
    for _ in range(3):
        assert "turn 1 of 1" in _show(view, flow).text
    assert reads == ["s-cache"]

    second = _capture(store, "s-cache", [1, 2, 3, 10, 11, 4], [12], [-0.5], result)
    assert "turn 1 of 2" in _show(view, flow).text  # the new call is seen at once
    assert "turn 2 of 2" in _show(view, _flow({"row": second, "call_id": f"c{second:04d}", "session": "s-cache"})).text
    assert reads == ["s-cache", "s-cache"]
    store.close()
