"""mitmweb's "polar" view, in a real browser: `polar proxy --web` in a subprocess, an agent turn through
it with the official OpenAI SDK (its second call streamed, as harnesses call), then Chromium selects the
streamed call, picks the polar view, and reads the session, the trajectory and the sampled tokens the
capture store holds."""

from __future__ import annotations

import math
import re

import httpx
import openai
import pytest

from polar.capture.reader import CaptureReader
from polar.mitm.contentview import LOW_MARK
from polar.mitm.proxy import ProxyConfig, SubprocessProxy, free_port
from polar.trajectories.builders import prefix_merge

WEB_TOKEN = "polar-view-test"
TOOLS = [{"type": "function", "function": {"name": "read_file", "parameters": {
    "type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}}]


def _agent_turn(base_url: str, session: str) -> None:
    """A tool call, then the streamed answer after the tool result: two calls, one trajectory."""
    client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="k", default_headers={"x-polar-session": session})
    messages = [{"role": "user", "content": "What does the README say?"}]
    first = client.chat.completions.create(model="tiny", messages=messages, tools=TOOLS).choices[0].message
    (call,) = first.tool_calls
    messages += [first.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": call.id, "content": "polar shows every call in mitmweb"}]
    chunks = client.chat.completions.create(model="tiny", messages=messages, tools=TOOLS, stream=True)
    second = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert second == "The README says polar shows every call."


@pytest.mark.browser
def test_mitmweb_polar_view_shows_the_captured_call(browser, double_server, tokenizer_dir, tmp_path):
    double, upstream = double_server
    httpx.post(f"{upstream}/_double/script", json={"steps": [
        {"reasoning": "Read it first.", "tool_calls": [{"name": "read_file", "arguments": {"path": "README.md"}}]},
        {"content": "The README says polar shows every call."},
    ]}).raise_for_status()
    db, web_port = tmp_path / "captures.db", free_port()
    proxy = SubprocessProxy(ProxyConfig(upstream=upstream, db=str(db), port=free_port(), tokenizer=str(tokenizer_dir),
                                        web=True, web_port=web_port, extra={"web_password": WEB_TOKEN}))
    proxy.start()
    try:
        _agent_turn(proxy.url, "view-1")
        rows = list(CaptureReader(db).calls(session="view-1"))
        (trajectory,) = prefix_merge(rows)
        answer = rows[1]  # the call the browser inspects

        page = browser.new_page(viewport={"width": 1400, "height": 1400})
        page.goto(f"http://127.0.0.1:{web_port}/?token={WEB_TOKEN}")
        page.locator(".flow-table tbody tr.has-response").nth(1).click()
        page.locator(".flow-detail nav a", has_text="Response").click()
        page.locator(".flow-detail .contentview a", has_text="View:").click()
        page.get_by_role("link", name="polar", exact=True).click()
        view = page.locator(".flow-detail .contentview pre")
        view.get_by_text("in order").wait_for()
        page.screenshot(path=str(tmp_path / "mitmweb-polar-view.png"))
        lines = [line.rstrip() for line in view.inner_text().splitlines()]
    finally:
        proxy.stop()

    assert "session     view-1  (2 calls, 1 trajectory)" in lines
    assert f"trajectory  {trajectory.id} · prefix-merge · turn 2 of 2" in lines
    assert f"call        {answer['call_id']} · row {answer['id']} · openai_chat generate" in lines
    assert "content" in lines and "            The README says polar shows every call." in lines
    # The sampled tokens as the store holds them, each with its logprob; low ones carry the mark.
    table = lines[lines.index("in order") + 2 :][: answer["completion_len"]]
    assert len(table) == answer["completion_len"] > 0
    for pos, (line, token_id, logprob) in enumerate(zip(table, answer["completion_ids"], answer["completion_logprobs"])):
        mark = re.escape(LOW_MARK) if logprob < math.log(0.1) else " {%d}" % len(LOW_MARK)
        assert re.fullmatch(rf'{mark} +{pos} +{token_id} +".*" +{logprob:.3f} +{math.exp(logprob):.3f}', line), line
    assert any('" says"' in line for line in table)  # decoded with the served model's tokenizer
    low = sum(lp < math.log(0.1) for lp in answer["completion_logprobs"])
    assert sum(line.startswith(LOW_MARK) for line in table) == low > 0  # the double's logprobs for this script
