"""Weight updates: a paused gateway holds model calls until resume, and stamps the trainer's version."""

from __future__ import annotations

import threading
import time
import uuid

import httpx


def test_pause_holds_calls_and_resume_stamps_the_policy_version(stack):
    stack.script(steps=[{"content": "after the update"}])
    session = f"wu-{uuid.uuid4().hex[:6]}"
    body = {"model": "gpt-x", "messages": [{"role": "user", "content": "hi"}]}
    answers: list[httpx.Response] = []

    stack.proxy.pause_sampling()
    try:
        caller = threading.Thread(target=lambda: answers.append(httpx.post(
            f"{stack.url}/v1/chat/completions", json=body, headers={"x-polar-session": session}, timeout=60)))
        caller.start()
        time.sleep(1.5)
        assert not answers  # held, not refused
        assert stack.proxy.drain(timeout=1)  # nothing is being sampled while paused
    finally:
        stack.proxy.resume_sampling(42)
    caller.join(timeout=30)
    assert answers and answers[0].status_code == 200
    assert answers[0].json()["choices"][0]["message"]["content"] == "after the update"
    try:
        (row,) = stack.rows(session)
        assert row["policy_version"] == 42
    finally:
        stack.proxy.addon.gate.policy_version = None  # the shared stack's later tests see no version
