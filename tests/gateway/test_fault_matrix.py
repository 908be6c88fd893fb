"""The fault matrix (docs/faults.md): one case per fault, a real client through a real polar proxy.

Each case asserts what the client saw (status, its provider's error shape, never an answer whose
capture was lost), what the capture database says afterwards (row status and error, nothing already
captured lost) and that the proxy serves the next call. The gateway killed mid-call (SIGKILL, row
`interrupted`) is `tests/gateway/test_crash_resume.py::test_a_call_in_flight_when_the_gateway_dies_is_marked_interrupted`.
"""

from __future__ import annotations

import base64
import os
import resource
import sqlite3
from contextlib import contextmanager
from pathlib import Path

import anthropic
import httpx
import openai
import pytest

from polar.capture.reader import CaptureReader
from polar.mitm.proxy import ProxyConfig, SubprocessProxy, free_port
from tests.support.disk import fill, small_tmpfs

REFUSED = "polar could not record this call"


@contextmanager
def _proxy(upstream: str, db: Path, **extra):
    proxy = SubprocessProxy(ProxyConfig(upstream=upstream, db=str(db), port=free_port(),
                                        extra={"polar_upstream_timeout": 3, "polar_db_busy_timeout": 1, **extra}))
    proxy.start()
    try:
        yield proxy
    finally:
        proxy.stop()


@pytest.fixture(scope="module")
def plain(double_server, tmp_path_factory):
    """One proxy for the faults that leave the database as it was (lock, encoding, upstream)."""
    db = tmp_path_factory.mktemp("faults") / "captures.db"
    with _proxy(double_server[1], db) as proxy:
        yield proxy, db


@pytest.fixture
def small_disk(tmp_path):
    """A 24 MB tmpfs of its own: a real ENOSPC, not a simulated one."""
    with small_tmpfs(tmp_path / "disk") as mnt:
        yield mnt


def _client(proxy) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="sk-test", max_retries=0, timeout=30)


def _ask(proxy, session: str, **extra) -> str:
    """A call that must be answered; returns its call id."""
    raw = _client(proxy).chat.completions.with_raw_response.create(
        model="gpt-x", messages=[{"role": "user", "content": "hi"}], extra_headers={"x-polar-session": session}, **extra)
    assert raw.parse().choices[0].message.content is not None
    return raw.headers["x-polar-call-id"]


def _refused(proxy, session: str, *words: str, **extra) -> str:
    """A call polar must refuse with OpenAI's own 500 saying its capture failed; returns its call id."""
    with pytest.raises(openai.InternalServerError) as err:
        _ask(proxy, session, **extra)
    resp = err.value.response
    body = resp.json()["error"]
    assert resp.status_code == 500 and body["type"] and REFUSED in body["message"], body
    for word in words:
        assert word in body["message"], body
    return resp.headers["x-polar-call-id"]


def _rows(db: Path) -> dict[str, dict]:
    return {r["call_id"]: r for r in CaptureReader(db).calls(with_tokens=False)}


def _incompressible(size: int) -> str:
    return base64.b64encode(os.urandom(size)).decode()


# -- the capture database --------------------------------------------------------------------


def test_disk_full(double_server, small_disk):
    """ENOSPC mid-session: SQLite reports SQLITE_FULL ("database or disk is full")."""
    db = small_disk / "captures.db"
    with _proxy(double_server[1], db) as proxy:
        before = _ask(proxy, "full")
        filler = fill(small_disk)  # fill what is left of the disk
        # A small row may still fit the pages of the WAL presized at start-up; this one cannot.
        pad = {"extra_body": {"metadata": {"pad": _incompressible(5_000_000)}}}
        lost = _refused(proxy, "full", "full", **pad)
        filler.unlink()  # space again: the same proxy goes on
        after = _ask(proxy, "full", **pad)
    rows = _rows(db)
    assert rows[before]["status"] == rows[after]["status"] == "ok"
    assert lost not in rows  # its client got the error, not an answer: no row is the honest record


def test_io_error(double_server, tmp_path):
    """Every file write failing (EFBIG under a file-size limit, set on the running proxy): SQLite
    reports SQLITE_IOERR ("disk I/O error")."""
    db = tmp_path / "captures.db"
    with _proxy(double_server[1], db) as proxy:
        before = _ask(proxy, "io")
        limits = resource.prlimit(proxy.proc.pid, resource.RLIMIT_FSIZE, (1, resource.RLIM_INFINITY))  # soft only
        try:
            lost = _refused(proxy, "io", "disk I/O error")
        finally:
            resource.prlimit(proxy.proc.pid, resource.RLIMIT_FSIZE, limits)
        after = _ask(proxy, "io")
    rows = _rows(db)
    assert rows[before]["status"] == rows[after]["status"] == "ok" and lost not in rows


def test_database_moved_away(double_server, tmp_path):
    """SQLite (WAL) would go on writing to a moved or deleted file without an error; the writer notices."""
    db = tmp_path / "captures.db"
    with _proxy(double_server[1], db) as proxy:
        before = _ask(proxy, "moved")
        away = tmp_path / "elsewhere.db"
        db.rename(away)
        lost = _refused(proxy, "moved", "deleted, moved or replaced")
        away.rename(db)  # the same file back at its path: writes go on
        after = _ask(proxy, "moved")
    rows = _rows(db)
    assert rows[before]["status"] == rows[after]["status"] == "ok" and lost not in rows


def test_database_locked_by_another_process(plain):
    """Another connection holds the write lock longer than polar_db_busy_timeout (1 s here)."""
    proxy, db = plain
    before = _ask(proxy, "locked")
    other = sqlite3.connect(db, isolation_level=None)
    other.execute("BEGIN EXCLUSIVE")
    try:
        lost = _refused(proxy, "locked", "database is locked")
    finally:
        other.execute("ROLLBACK")
        other.close()
    after = _ask(proxy, "locked")
    rows = _rows(db)
    assert rows[before]["status"] == rows[after]["status"] == "ok" and lost not in rows


def test_a_row_that_cannot_be_encoded(plain):
    """A lone surrogate escape ("\\ud800") is valid JSON and decodes to a str SQLite cannot store as UTF-8:
    the gateway refuses it at the door (400, in the caller's shape) and records the refusal. A completion
    that still cannot be encoded is marked capture_failed by the writer (tests/capture/test_writer.py)."""
    proxy, db = plain
    body = b'{"model": "gpt-x", "messages": [{"role": "user", "content": "hi \\ud800"}]}'
    resp = httpx.post(f"{proxy.url}/v1/chat/completions", content=body, timeout=30,
                      headers={"content-type": "application/json", "x-polar-session": "odd", "authorization": "Bearer k"})
    error = resp.json()["error"]
    assert resp.status_code == 400 and "surrogate" in error["message"], resp.text
    row = _rows(db)[resp.headers["x-polar-call-id"]]
    assert row["status"] == "error" and row["error_kind"] == "invalid_request" and "surrogate" in row["error"]
    _ask(proxy, "odd")


# -- the upstream ----------------------------------------------------------------------------


@pytest.mark.parametrize("mode,kind,status", [
    ("reset", "upstream_error", 502),  # the connection breaks mid-body
    ("garbage", "upstream_error", 502),  # a 200 whose body is not JSON
    ("timeout", "upstream_timeout", 504),  # no answer within polar_upstream_timeout (3 s here)
])
def test_upstream_dies_mid_answer(plain, double_server, mode, kind, status):
    proxy, db = plain
    httpx.post(f"{double_server[1]}/_double/fault", json={"mode": mode, "seconds": 10, "count": 1}).raise_for_status()
    with pytest.raises(openai.APIStatusError) as err:
        _ask(proxy, f"up-{mode}")
    resp = err.value.response
    assert resp.status_code == status and resp.json()["error"]["message"], resp.text
    row = _rows(db)[resp.headers["x-polar-call-id"]]
    assert (row["status"], row["error_kind"], row["http_status"]) == ("error", kind, status) and row["error"]
    _ask(proxy, f"up-{mode}")


def test_upstream_reset_under_a_streaming_client(plain, double_server):
    """The upstream answered 200 and then broke: the stream had begun, so the client gets Anthropic's in-stream
    error event (the SDK raises it) and the row says what happened. (An upstream that breaks before its headers,
    as vLLM sends them only with the first token, is a plain 502: test_upstream_reset_mid_body.)"""
    proxy, db = plain
    httpx.post(f"{double_server[1]}/_double/fault", json={"mode": "reset", "count": 1}).raise_for_status()
    client = anthropic.Anthropic(base_url=proxy.url, api_key="sk-ant", max_retries=0, timeout=30)
    messages = [{"role": "user", "content": "hi"}]
    with pytest.raises(anthropic.APIStatusError) as err, client.messages.stream(
            model="claude-x", max_tokens=32, messages=messages) as stream:
        stream.get_final_message()
    assert err.value.body["type"] == "error" and err.value.body["error"]["type"] == "api_error"
    assert "broke off" in err.value.body["error"]["message"]
    row = _rows(db)[err.value.response.headers["x-polar-call-id"]]
    assert (row["status"], row["error_kind"], row["stream"]) == ("error", "upstream_error", 1)


# -- polar itself ----------------------------------------------------------------------------


def test_a_polar_bug_past_the_pipeline_guard_never_reaches_the_upstream(stack, monkeypatch):
    """mitmproxy sends a flow the addon left without a response on to the upstream (reverse mode):
    an exception out of the gateway must become an error answer, not an uncaptured call."""
    gateway = stack.proxy.addon.gateway
    sent = stack.double.generations

    async def boom(req):
        raise RuntimeError("a bug")

    monkeypatch.setattr(gateway, "handle", boom)
    resp = httpx.post(f"{stack.url}/v1/chat/completions", timeout=30,
                      json={"model": "gpt-x", "messages": [{"role": "user", "content": "hi"}]})
    assert resp.status_code == 500 and "a bug" in resp.json()["error"]["message"], resp.text
    assert stack.double.generations == sent
