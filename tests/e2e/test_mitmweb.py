"""`polar proxy --web`: every model call shows up in mitmweb with polar's session, provider and tokens,
streamed ones included (they leave through polar's loopback relay, but the flow shows the client's own
request and the whole streamed answer)."""

from __future__ import annotations

import time

import httpx

from polar.mitm.proxy import ProxyConfig, SubprocessProxy, free_port


def test_mitmweb_lists_calls_with_polar_metadata(double_server, tmp_path):
    double, upstream = double_server
    httpx.post(f"{upstream}/_double/script", json={"steps": [{"content": "seen in mitmweb"}]}).raise_for_status()
    web_port = free_port()
    proxy = SubprocessProxy(ProxyConfig(upstream=upstream, db=str(tmp_path / "c.db"), port=free_port(), web=True,
                                        web_port=web_port, extra={"web_password": "polar-test"}))
    proxy.start()
    try:
        resp = httpx.post(f"{proxy.url}/v1/chat/completions",
                          headers={"x-polar-session": "web-1", "authorization": "Bearer sk-harness-secret"},
                          json={"model": "gpt-x", "messages": [{"role": "user", "content": "hi"}]}, timeout=30)
        assert resp.json()["choices"][0]["message"]["content"] == "seen in mitmweb"
        streamed = httpx.post(f"{proxy.url}/v1/chat/completions", headers={"x-polar-session": "web-2"}, timeout=30,
                              json={"model": "gpt-x", "stream": True, "messages": [{"role": "user", "content": "hi"}]})
        assert b"seen" in streamed.content and streamed.content.endswith(b"data: [DONE]\n\n")
        with httpx.Client(base_url=f"http://127.0.0.1:{web_port}", timeout=10) as web:
            assert web.get("/", params={"token": "polar-test"}).status_code == 200  # sets the auth cookie
            deadline = time.time() + 10
            while len(flows := web.get("/flows").json()) < 2 and time.time() < deadline:
                time.sleep(0.2)
            (live,) = [f for f in flows if "session=web-2" in f["comment"]]
            # the flow keeps the client's request (not the relay's) and the whole stream it was sent
            assert live["request"]["port"] != 0 and "x-polar-relay" not in dict(live["request"]["headers"])
            assert live["request"]["contentLength"] > 0 and "completion_tokens=" in live["comment"]
            body = web.get(f"/flows/{live['id']}/response/content.data").content
            assert body == streamed.content
        (flow,) = [f for f in flows if "session=web-1" in f["comment"]]
        assert "session=web-1" in flow["comment"] and "provider=openai_chat" in flow["comment"]
        assert "completion_tokens=" in flow["comment"]
        # The harness's key identified it and is gone: mitmweb shows (and would save) it redacted.
        assert ["authorization", "<redacted>"] in flow["request"]["headers"]
        with httpx.Client(base_url=f"http://127.0.0.1:{web_port}", timeout=10) as web:
            web.get("/", params={"token": "polar-test"})
            dumped = web.get("/flows/dump").content  # every flow, as `mitmweb` would save it
        assert dumped and b"sk-harness-secret" not in dumped
    finally:
        proxy.stop()
