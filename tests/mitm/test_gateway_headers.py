"""The headers the addon hands the gateway: mitmproxy's own reading of the lines, in one pass.

Any header lines (names in any case, repeated, values of any bytes): every header reads as mitmproxy's
`Headers` reads it (repeated ones joined with ", "), except the ones that name a session, of which the
last line counts (tests/mitm/test_front.py: as the `--workers` front reads them).
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from mitmproxy import http

from polar.mitm.flows import gateway_headers
from polar.sessions.identity import IDENTITY_HEADERS

NAMES = st.sampled_from([b"Accept", b"accept", b"Anthropic-Beta", b"anthropic-beta", b"X-Polar-Session",
                         b"x-polar-session", b"Authorization", b"x-api-key", b"X-Goog-Api-Key", b"content-type",
                         "caf\u00e9".encode()])
VALUES = st.binary(max_size=40).filter(lambda b: b"\r" not in b and b"\n" not in b)


@given(st.lists(st.tuples(NAMES, VALUES), max_size=12))
def test_headers_read_as_mitmproxy_reads_them(fields):
    headers = http.Headers(fields)
    got = gateway_headers(headers)
    assert set(got) == {name.lower() for name in headers}
    for name in headers:
        lines = headers.get_all(name)
        expected = lines[-1] if name.lower() in IDENTITY_HEADERS else headers[name]
        assert got[name.lower()] == expected, name
