"""The `--workers` front (real haproxy) keys a call by the session polar itself names, for any spelling.

Two requests polar takes for one session must reach one worker, or the session's state splits in two.
Here haproxy runs the generated config with one line added that answers each request with the key it
computed; the same raw bytes go through mitmproxy's own HTTP/1 reader and polar's resolver (no
worker needed), and the two names must agree: hostile header values (whitespace of every kind,
UTF-8 and stray bytes, control bytes, repeated lines, over-long names, "Bearer" spelt any way), and
random bytes by hypothesis.
"""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mitmproxy.net.http.http1.read import read_request_head

from polar.mitm.flows import gateway_headers
from polar.mitm.proxy import free_port
from polar.sessions.identity import SessionRegistry
from polar.supervise.front import haproxy_config
from tests.mitm.test_workers import haproxy_ready  # noqa: F401  (the fixture: haproxy must be installed)

ECHO = '  http-request return status 200 content-type text/plain lf-string "%[var(txn.polar_key),hex]"'  # hex: the bytes as hashed


@pytest.fixture(scope="module")
def front(haproxy_ready, tmp_path_factory) -> Iterator[int]:  # noqa: F811
    """haproxy on the generated config, answering every request with its affinity key (no worker behind)."""
    port = free_port()
    config = haproxy_config("127.0.0.1", port, [free_port(), free_port()])
    assert "  default_backend workers" in config
    path = tmp_path_factory.mktemp("front") / "haproxy.cfg"
    path.write_text(config.replace("  default_backend workers", f"{ECHO}\n  default_backend workers"))
    proc = subprocess.Popen(["haproxy", "-f", str(path)], stderr=subprocess.PIPE)
    deadline = time.monotonic() + 10
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
            time.sleep(0.05)
    yield port
    proc.terminate()
    proc.wait(timeout=10)


def request(path: str, header_lines: list[bytes]) -> bytes:
    return b"".join([f"GET {path} HTTP/1.1\r\n".encode(), b"host: polar\r\nconnection: close\r\n",
                     *(line + b"\r\n" for line in header_lines), b"\r\n"])


def front_key(port: int, raw: bytes) -> str | None:
    """The key haproxy hashed this request by; None if haproxy refused the request itself."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(raw)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 200"):
        return None
    return bytes.fromhex(body.decode()).decode("utf-8", "surrogateescape")


def polar_session(raw: bytes, registry: SessionRegistry) -> tuple[str, str] | None:
    """(session, source) as a worker names this request; None if mitmproxy refuses it before polar sees it."""
    try:
        req = read_request_head(raw.split(b"\r\n")[:-2])
    except ValueError:
        return None
    ident = registry.resolve(req.path.split("?", 1)[0], gateway_headers(req.headers), "127.0.0.1")
    return ident.session, ident.source


def assert_same_session(port: int, path: str, header_lines: list[bytes]) -> None:
    registry = SessionRegistry(salt=b"front-test")
    raw = request(path, header_lines)
    key, named = front_key(port, raw), polar_session(raw, registry)
    if key is None or named is None:  # refused at the front or by mitmproxy: no worker keeps state for it
        return
    session, source = named
    if source == "key":
        assert session == f"key-{registry.hash_key(key)[:16]}", (header_lines, key, session)
    elif source == "address":
        src = socket.inet_aton("127.0.0.1").decode("latin-1")  # haproxy keeps an address as its 4 bytes
        assert (key, session) == (src, "addr-127.0.0.1"), (header_lines, key, session)
    else:
        assert key == session, (header_lines, key, session)


SPELLINGS = [
    [b"x-polar-session: plain-1"],
    [b"x-polar-session: a b"],
    [b"x-polar-session: a_b"],
    [b"x-polar-session: caf\xc3\xa9"],  # UTF-8: two bytes, two "_" (polar once made it one)
    [b"x-polar-session: caf\xe9"],  # a stray Latin-1 byte
    [b"x-polar-session:  \t padded \t "],
    [b"x-polar-session: \x0bvt\x0c"],  # trimmed by mitmproxy; haproxy keeps them unless told
    [b"x-polar-session: a\x00b\x01c\x7f"],
    [b"x-polar-session: a, b"],
    [b"x-polar-session: a", b"x-polar-session: b"],  # repeated: the last line (haproxy's fhdr)
    [b"X-Polar-Session: first", b"x-polar-session: second"],
    [b"x-polar-session: " + b"z" * 200],
    [b"x-polar-session: " + b"\xc3\xa9" * 100],  # 200 bytes cut at 128
    [b"x-polar-session:"],
    [b"x-polar-session: \x0b"],  # trims to nothing: names nothing, on both sides
    [b"x-polar-session: \x0b", b"authorization: Bearer sk-1"],
    [b"authorization: Bearer sk-1"],
    [b"authorization: bearer sk-1"],
    [b"authorization: BEARER \t  sk-1"],
    [b"authorization: Bearer\tsk-1"],  # not "Bearer ": the whole value is the key
    [b"authorization: Bearer"],
    [b"authorization: sk-raw"],
    [b"authorization: Bearer a", b"authorization: Bearer b"],
    [b"x-api-key: \x0bk-1", b"authorization: Bearer other"],
    [b"x-api-key: \x0b", b"x-goog-api-key: g-1"],
    [b"api-key: a-1"],
    [],
]


@pytest.mark.parametrize("lines", SPELLINGS, ids=range(len(SPELLINGS)))
def test_every_spelling_reaches_the_worker_of_its_session(front, lines):
    assert_same_session(front, "/v1/messages", lines)


@pytest.mark.parametrize("path", ["/s/run-1/v1/messages", "/s/run-1", "/s/run-1?x=1", "/s/a%20b/v1/messages",
                                  "/s/" + "p" * 129 + "/v1/messages", "/s//v1/messages"])
def test_a_path_prefix_names_the_same_session_on_both_sides(front, path):
    assert_same_session(front, path, [])
    assert_same_session(front, path, [b"x-polar-session: \x0b"])  # a header that names nothing defers to the path


HEADER_VALUE = st.binary(max_size=200).filter(lambda b: b"\r" not in b and b"\n" not in b)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.sampled_from([b"x-polar-session", b"authorization", b"x-api-key"]), values=st.lists(HEADER_VALUE, min_size=1, max_size=3))
def test_any_header_bytes_reach_the_worker_of_their_session(front, name, values):
    assert_same_session(front, "/v1/chat/completions", [name + b": " + v for v in values])
