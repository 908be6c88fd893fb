"""The local-process runtime: explicit-proxy mode through the real proxy (regular mode) and the double."""

from __future__ import annotations

import json
import sys
import time

import pytest

from polar.mitm.transparent import add_listeners, ca_cert_path, remove_listeners
from polar.sandboxes import Mount, SandboxSpec
from polar.sandboxes.local import LocalRuntime

OPENAI_SDK_CALL = """
import openai
reply = openai.OpenAI(api_key="sk-local-sdk", max_retries=0).chat.completions.create(
    model="gpt-4o", messages=[{"role": "user", "content": "hello through the SDK"}])
print(reply.choices[0].message.content)
"""


@pytest.fixture(scope="module")
def regular_proxy(stack):
    """The session's in-process polar, plus an explicit-proxy (regular mode) listener."""
    from polar.mitm.proxy import free_port

    spec = f"regular@127.0.0.1:{free_port()}"
    add_listeners([spec])
    yield stack.proxy, f"http://{spec.split('@', 1)[1]}", ca_cert_path(stack.proxy.config.confdir)
    remove_listeners([spec])


@pytest.fixture
def runtime(regular_proxy, tmp_path):
    _, proxy_url, ca_cert = regular_proxy
    return LocalRuntime(proxy_url, ca_cert, root=tmp_path)


def test_https_calls_go_through_polar_in_explicit_proxy_mode(regular_proxy, runtime, monkeypatch):
    proxy = regular_proxy[0]
    monkeypatch.setenv("OPENAI_BASE_URL", "http://somewhere-else.invalid/v1")  # the developer's shell must not leak in
    registry = proxy.addon.gateway.registry
    registry.register_key("sk-local-curl", "local-curl")
    registry.register_key("sk-local-sdk", "local-sdk")
    with runtime.start(SandboxSpec(image="host", session="local")) as box:
        body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi via curl"}]})
        curl = box.exec(
            ["curl", "-sS", "--fail-with-body", "https://api.openai.com/v1/chat/completions", "-d", body,
             "-H", "authorization: Bearer sk-local-curl", "-H", "content-type: application/json"],
            timeout=30,
        )
        sdk = box.exec([sys.executable, "-c", OPENAI_SDK_CALL], timeout=60)
    assert curl.ok, curl
    assert "hi via curl" in json.loads(curl.stdout)["choices"][0]["message"]["content"]
    assert sdk.ok and "hello through the SDK" in sdk.stdout, sdk
    store = proxy.addon.gateway.reader
    for session in ("local-curl", "local-sdk"):
        rows = list(store.calls(session=session, with_tokens=False))
        assert [(r["provider"], r["status"]) for r in rows] == [("openai_chat", "ok")]


def test_environment_points_at_polar_only(runtime, monkeypatch):
    monkeypatch.setenv("ANTHROPIC_BASE_URL", "http://elsewhere.invalid")
    monkeypatch.setenv("HTTPS_PROXY", "http://corporate-proxy.invalid:3128")
    with runtime.start(SandboxSpec(image="host", session="env", env={"MY_FLAG": "1"})) as box:
        env = dict(line.split("=", 1) for line in box.exec("env").stdout.splitlines() if "=" in line)
    assert env["HTTPS_PROXY"] == env["https_proxy"] == runtime.proxy_url
    assert env["NODE_EXTRA_CA_CERTS"] == env["SSL_CERT_FILE"] == runtime.ca_cert
    assert "ANTHROPIC_BASE_URL" not in env and env["MY_FLAG"] == "1"


def test_paths_copies_mounts_and_timeouts(runtime, tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "data.txt").write_text("mounted")
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "sub" / "a.txt").write_text("alpha")
    spec = SandboxSpec(image="host", session="files", mounts=[Mount(str(shared), "/work/data")])
    with runtime.start(spec) as box:
        box.copy_in(src, "/work/task")
        done = box.exec("cat task/sub/a.txt data/data.txt && echo beta > task/sub/b.txt")
        box.copy_out("/work/task", tmp_path / "back")
        started = time.monotonic()
        slow = box.exec("sleep 30 & sleep 30; echo never", timeout=0.5)
        elapsed = time.monotonic() - started
        with pytest.raises(ValueError, match="leaves the sandbox"):
            box.copy_in(src, "/../../outside")
        root = box.root
    assert done.ok and done.stdout == "alphamounted"
    assert (tmp_path / "back" / "sub" / "b.txt").read_text() == "beta\n"
    assert slow.timed_out and "never" not in slow.stdout and elapsed < 5
    assert not root.exists()  # stop removes the sandbox's files
