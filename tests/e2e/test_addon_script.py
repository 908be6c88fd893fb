"""`mitmdump -s addons/polar_gateway.py` as a user would run it: explicit-proxy mode, HTTPS.

The client keeps its real provider URL (https://api.anthropic.com) and only sets a proxy and
trusts mitmproxy's CA; the flows mitmproxy saves carry polar's session/provider/token metadata,
which is what mitmweb displays.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from polar.capture.reader import CaptureReader
from polar.mitm.proxy import free_port

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def mitmdump(stack, tmp_path):
    exe = Path(sys.executable).with_name("mitmdump")
    if not exe.exists():
        exe = Path(shutil.which("mitmdump") or "mitmdump")
    port = free_port()
    db, flows, confdir = tmp_path / "captures.db", tmp_path / "flows.mitm", tmp_path / "mitm"
    proc = subprocess.Popen(
        [str(exe), "-q", "-s", str(REPO / "addons" / "polar_gateway.py"), "--mode", f"regular@{port}",
         "--listen-host", "127.0.0.1", "--set", f"confdir={confdir}", "--set", "connection_strategy=lazy",
         "--set", "upstream_cert=false", "-w", str(flows),
         "--set", f"polar_upstream={stack.upstream_url}", "--set", f"polar_db={db}"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )
    ca = confdir / "mitmproxy-ca-cert.pem"
    deadline = time.time() + 60
    while not ca.exists() or not _listening(port):
        assert proc.poll() is None, proc.stdout.read().decode()
        assert time.time() < deadline, "mitmdump did not start"
        time.sleep(0.1)
    yield f"http://127.0.0.1:{port}", ca, db, flows
    proc.terminate()
    proc.wait(timeout=30)


def _listening(port: int) -> bool:
    import socket

    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
        return True
    except OSError:
        return False


def test_explicit_proxy_https_with_addon_script(stack, mitmdump):
    proxy_url, ca, db, flows = mitmdump
    stack.script(steps=[{"content": "hello through the explicit proxy"}])
    with httpx.Client(proxy=proxy_url, verify=str(ca), timeout=30) as client:
        resp = client.post(
            "https://api.anthropic.com/v1/messages",
            headers={"x-api-key": "sk-ant-secret", "anthropic-version": "2023-06-01"},
            json={"model": "claude-x", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]},
        )
    assert resp.status_code == 200, resp.text
    assert resp.json()["content"][0]["text"] == "hello through the explicit proxy"
    time.sleep(0.5)  # let mitmdump flush the flow file
    rows = list(CaptureReader(db).calls())
    assert len(rows) == 1 and rows[0]["provider"] == "anthropic" and rows[0]["completion_len"] > 0

    from mitmproxy import io

    with open(flows, "rb") as f:
        saved = [fl for fl in io.FlowReader(f).stream() if fl.request.path.startswith("/v1/messages")]
    assert saved, "mitmdump saved no flow"
    meta = saved[-1].metadata["polar"]
    assert meta["provider"] == "anthropic" and meta["completion_tokens"] == rows[0]["completion_len"]
    assert "session=" in saved[-1].comment and "completion_tokens=" in saved[-1].comment
