"""Re-render mode (vLLM renders the whole conversation each turn) against the real Qwen templates.

The same kind of session that stays token-faithful in token mode loses its prefix here wherever
the template re-renders earlier turns differently; the drift report must say where. Qwen3.5 cuts
earlier reasoning when a user message arrives; Qwen3 (hybrid) does too. Qwen3-Coder (which writes
no reasoning) and the project's own template keep the prefix, so the same session shows no break.
"""

from __future__ import annotations

import uuid

import pytest

from polar.doubles.scripted_vllm import BackgroundServer, ScriptedVLLM
from polar.mitm.proxy import ProxyConfig, SubprocessProxy, free_port
from polar.trajectories.builders import prefix_merge
from polar.trajectories.drift import drift_report
from tests.conftest import real_template
from tests.e2e.sessions import drive_chat

STEPS = [{"reasoning": f"Thinking about request {i}.", "content": f"Answer {i}."} for i in range(6)]


def _stack_with_template(tokenizer_dir, template, tmp_path):
    """A double serving `template` with the real tokenizer, and polar in re-render (chat) mode."""
    double = ScriptedVLLM(tokenizer_dir, "polar-tiny", chat_template=template)
    server = BackgroundServer(double.app)
    upstream = server.start()
    proxy = SubprocessProxy(ProxyConfig(upstream=upstream, db=str(tmp_path / "captures.db"), port=free_port()))
    proxy.start()
    return double, server, proxy


@pytest.mark.parametrize("template_name,expect_breaks", [
    ("qwen3.5-4b", True),
    ("qwen3-hybrid", True),
    ("qwen3-coder", False),
    (None, False),  # the project's own template
])
def test_rerender_drift_is_reported(tokenizer_dir, tmp_path, template_name, expect_breaks):
    template = real_template(template_name) if template_name else None
    double, server, proxy = _stack_with_template(tokenizer_dir, template, tmp_path)
    try:
        import httpx

        httpx.post(f"{server_url(server)}/_double/script", json={"steps": STEPS}).raise_for_status()
        session = f"rr-{uuid.uuid4().hex[:6]}"
        drive_chat(proxy.url, session, thinking=True, turns=6)
    finally:
        proxy.stop()
        server.stop()
    from polar.capture.reader import CaptureReader

    rows = list(CaptureReader(tmp_path / "captures.db").calls(session=session))
    assert len(rows) == 6 and all(r["prompt_mode"] == "chat-template" for r in rows)
    (report,) = drift_report(rows, tokenizer=double.tokenizer)
    trajectories = prefix_merge(rows)
    if expect_breaks:
        # every user message after an answer with reasoning cuts that reasoning from the history
        assert len(report.breaks) == 5 and len(trajectories) == 6
        for brk in report.breaks:
            # The break starts where the earlier think block was (its opening tag may belong to
            # the generation prompt, i.e. context) and what went missing is the sampled reasoning.
            assert brk.region in ("sampled", "context") and brk.earlier_row_id == brk.row_id - 1
            assert "Thinking about request" in (brk.expected_text or "")
            assert "Thinking about request" not in (brk.actual_text or "")
        assert report.reappeared_tokens < report.carried_tokens
    else:
        assert report.breaks == [] and len(trajectories) == 1
        assert report.reappeared_tokens == report.carried_tokens


def server_url(server: BackgroundServer) -> str:
    host, port = server.server.servers[0].sockets[0].getsockname()[:2]
    return f"http://{host}:{port}"
