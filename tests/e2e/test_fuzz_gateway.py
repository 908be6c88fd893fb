"""Property-based fuzzing of the whole gateway over HTTP: thousands of generated and mutated requests
against the four provider APIs, and not one 5xx for a client's mistake.

The parser-level fuzz tests (tests/providers/) check each parser alone; this sends the requests
through the real proxy (detection, session, parsing, token-faithful rendering, the upstream call,
capture), so a crash anywhere on that path shows up as a 5xx or a dropped connection. Each request
that reaches a model route leaves a capture row, and every error answer is in the caller's own shape.
The hostile probes (tests/support/hostile.py: nesting, methods, HEAD, binary bodies, content types)
share one keep-alive connection, so an answer that leaves bytes behind breaks the next one;
scripts/fuzz_gateway.py runs the same probes by the ten thousand.
"""

from __future__ import annotations

import json
import uuid

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.fuzz import drop, json_values, paths, replace
from tests.support.hostile import VALID, KeepAlive, error_shape, probe
from tests.support.scripts import load_script

JSON = json_values(text=20, ints=st.integers(-2**40, 2**40))


@st.composite
def mutated(draw, api: str) -> bytes:
    """A valid request with one field replaced or dropped, a random JSON document, or random bytes."""
    _, body = VALID[api]
    kind = draw(st.sampled_from(["replace", "replace", "drop", "json", "bytes"]))
    if kind == "replace":
        return json.dumps(replace(body, draw(st.sampled_from(paths(body))), draw(JSON))).encode()
    if kind == "drop":
        return json.dumps(drop(body, draw(st.sampled_from(paths(body)[1:])))).encode()
    if kind == "json":
        return json.dumps(draw(JSON)).encode()
    return draw(st.binary(max_size=200))


@pytest.fixture(scope="module")
def client(stack):
    with httpx.Client(base_url=stack.url, timeout=60) as c:
        yield c


@pytest.mark.parametrize("api", list(VALID))
def test_mutated_requests_get_client_errors_not_crashes(stack, client, api):
    session = f"fuzz-{api}-{uuid.uuid4().hex[:6]}"
    path, body = VALID[api]
    stack.script(rules=[{"match": "", "steps": [{"content": "ok"}]}])
    sent: list[int] = []

    @settings(max_examples=500, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
    @given(payload=mutated(api))
    def check(payload: bytes) -> None:
        reply = client.post(path, content=payload, headers={"content-type": "application/json",
                                                            "x-polar-session": session})
        sent.append(reply.status_code)
        assert reply.status_code < 500, (payload[:300], reply.status_code, reply.text[:300])
        if reply.status_code >= 400:
            assert error_shape(api, reply.status_code, reply.content), reply.text[:300]

    check()
    assert len(sent) >= 400 and any(s == 400 for s in sent)
    # The proxy still serves the valid request, and every call is on record.
    assert client.post(path, json=body, headers={"x-polar-session": session}).status_code == 200
    rows = stack.rows(session)
    assert len(rows) == len(sent) + 1
    assert {r["status"] for r in rows} <= {"ok", "error"}
    assert all(r["error_kind"] not in ("internal", "upstream_error") for r in rows)


def test_hostile_requests_keep_the_connection(stack):
    """Hostile probes over one keep-alive connection: no 5xx, shaped errors, HEAD bare, nothing dropped."""
    session = f"hostile-{uuid.uuid4().hex[:6]}"
    stack.script(rules=[{"match": "", "steps": [{"content": "ok"}]}])
    conn = KeepAlive(stack.url)
    outcomes = []

    @settings(max_examples=600, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
    @given(rng=st.randoms(use_true_random=False))
    def check(rng) -> None:
        out = conn.send(probe(rng, session))
        outcomes.append(out)
        assert not out.problems, (out.probe, out.status, out.problems)

    try:
        check()
    finally:
        conn.close()
    kinds = {o.probe.kind for o in outcomes}
    assert kinds == {"valid", "mutated", "nested", "method", "binary", "content_type", "unknown_path", "empty"}
    assert {405, 415, 204} <= {o.status for o in outcomes}
    assert any(o.probe.method == "HEAD" for o in outcomes)
    stored = {r["call_id"] for r in stack.rows(session)}
    assert {o.call_id for o in outcomes if o.call_id} == stored  # every POST, and only those, on record


def test_fuzz_script_smoke(stack, monkeypatch, capsys):
    """scripts/fuzz_gateway.py with a fixed seed against the running stack: its table, and no problem."""
    stack.script(rules=[{"match": "", "steps": [{"content": "ok"}]}])
    script = load_script(monkeypatch, "fuzz_gateway")
    report = script.main(["--requests", "300", "--seed", "13", "--connections", "2", "--url", stack.url,
                          "--db", str(stack.db)])
    out = capsys.readouterr().out
    assert len(report.outcomes) == 300 and not report.problems, out
    assert report.missing_rows == 0
    assert "api" in out and "all" in out and "problems: none" in out
