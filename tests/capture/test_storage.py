"""Linear capture storage: request bodies delta-encoded and rebuilt byte for byte, large canonical parts
stored once and read back unchanged, and databases written before either still read."""

from __future__ import annotations

import asyncio
import json
import random
import sqlite3
import time
import zlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from polar.capture import bodies
from polar.capture import writer as writer_module
from polar.capture.dictionaries import Dictionaries
from polar.capture.reader import CaptureReader
from polar.capture.records import CallEnd, CallStart, MessageLog, encode_messages
from polar.capture.writer import Arrival, CaptureError, CaptureWriter
from tests.support.captures import finish_now


def _start(call_id: str, session: str, body: bytes) -> CallStart:
    return CallStart(call_id=call_id, session_id=session, provider="test", endpoint="generate", path="/t", client=None,
                     key_hash=None, request_headers={}, request_body=body, t_start=time.time())


def _end(**fields) -> CallEnd:
    return CallEnd(**{"status": "ok", "http_status": 200, "response_body": b"{}", "t_end": time.time(), **fields})


def _write(writer: CaptureWriter, calls: list[CallStart], together: int = 1) -> list[int]:
    """Each call's arrival then completion; `together` calls at once, so their writes share transactions
    (a body then cannot be the base of another in its own transaction). Each response: its request
    reversed, so large ones are compressed too."""
    async def one(call: CallStart) -> int:
        return await writer.finish(writer.start(call), _end(response_body=call.request_body[::-1]))

    async def run() -> list[int]:
        ids: list[int] = []
        for at in range(0, len(calls), together):
            ids += await asyncio.gather(*(one(call) for call in calls[at : at + together]))
        return ids

    return asyncio.run(run())


# One edit of the previous body: what an agent's next request does to its last one, and what it never should.
_chunk = st.binary(min_size=0, max_size=3000)
_edit = st.one_of(
    st.tuples(st.just("append"), _chunk),
    st.tuples(st.just("insert"), st.floats(0, 1), _chunk),
    st.tuples(st.just("delete"), st.floats(0, 1), st.integers(0, 5000)),
    st.tuples(st.just("replace"), st.floats(0, 1), _chunk),
    st.tuples(st.just("unrelated"), st.binary(min_size=0, max_size=6000)),
    st.tuples(st.just("empty")),
    st.tuples(st.just("grow"), st.integers(1, 40)),  # a large, compressible append: past SMALL, deep chains
)


def _apply(body: bytes, edit: tuple) -> bytes:
    kind = edit[0]
    at = int(edit[1] * len(body)) if kind in ("insert", "delete", "replace") else 0
    if kind == "append":
        return body + edit[1]
    if kind == "insert":
        return body[:at] + edit[2] + body[at:]
    if kind == "delete":
        return body[:at] + body[at + edit[2]:]
    if kind == "replace":
        return body[:at] + edit[2] + body[at + len(edit[2]):]
    if kind == "unrelated":
        return edit[1]
    if kind == "empty":
        return b""
    return body + b"".join(b'{"turn": %d, "text": "\xff\xfe non-UTF-8 \xc3"}' % i for i in range(edit[1] * 20))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow, HealthCheck.data_too_large])
@given(edits=st.lists(st.tuples(st.sampled_from("ab"), _edit), min_size=1, max_size=45), chain=st.sampled_from([2, 5, 32]),
       together=st.integers(1, 6), lookback=st.sampled_from([0, 7, 1000, bodies.LOOKBACK]),
       answer_apart=st.sampled_from([bodies.SMALL, bodies.ANSWER_APART]))
def test_bodies_round_trip_byte_for_byte(tmp_path_factory, monkeypatch, edits, chain, together, lookback,
                                         answer_apart):
    """Random edit sequences over two interleaved sessions, written one by one or several at once through
    the real writer and read through the real reader: every body reads back exactly, alone or in a whole
    scan, and no chain of deltas is longer than CHAIN. Splices of every shape: edits at the start, the
    end or in between, bodies that shrink, grow or share nothing, dictionaries from none to LOOKBACK.
    Each response (the request reversed) too: stored apart from SMALL bytes on, or from ANSWER_APART."""
    monkeypatch.setattr(bodies, "CHAIN", chain)
    monkeypatch.setattr(bodies, "LOOKBACK", lookback)
    monkeypatch.setattr(writer_module, "ANSWER_APART", answer_apart)
    path = tmp_path_factory.mktemp("bodies") / "c.db"
    writer = CaptureWriter(path)
    last = {"a": b"", "b": b""}
    sent: dict[str, bytes] = {}
    calls = []
    for i, (session, edit) in enumerate(edits):
        last[session] = _apply(last[session], edit)
        sent[f"c{i}"] = last[session]
        calls.append(_start(f"c{i}", session, last[session]))
    session_of = {call.call_id: call.session_id for call in calls}
    _write(writer, calls, together)
    writer.close()
    reader = CaptureReader(path)
    rows = {r["call_id"]: r for r in reader.calls(with_tokens=False)}
    assert {k: r["request_body"] for k, r in rows.items()} == sent
    assert {k: r["response_body"] for k, r in rows.items()} == {k: body[::-1] for k, body in sent.items()}
    for call_id, body in sent.items():  # one row alone, nothing memoised
        row = reader.find_call(call_id, session_of[call_id])
        assert row["request_body"] == body and row["response_body"] == body[::-1]
    with reader.connect() as conn:
        links = dict(conn.execute("SELECT id, base FROM bodies").fetchall())
    for row_id in links:
        depth, cur = 0, row_id
        while links[cur] is not None:
            depth, cur = depth + 1, links[cur]
        assert depth < chain


def _growing_session(writer: CaptureWriter, system: bytes, turns: list[bytes]):
    """One session whose every body is the last plus a user turn, written and closed: the last body,
    the calls, and each call's (body_encoding, stored bytes) in order."""
    body, calls = b'{"system": "' + system + b'", "messages": [', []
    for n, text in enumerate(turns):
        body += b'{"role": "user", "content": "%s"},' % text
        calls.append(_start(f"c{n}", "s", body))
    _write(writer, calls)
    writer.close()
    with sqlite3.connect(writer.path) as conn:
        return body, calls, conn.execute("SELECT body_encoding, length(data) FROM calls JOIN bodies "
                                         "ON body_id = bodies.id ORDER BY calls.id").fetchall()


def test_bodies_are_stored_as_deltas_of_their_session(tmp_path):
    """An agent's growing history costs its new bytes, not its whole body, on every turn."""
    writer = CaptureWriter(tmp_path / "c.db")
    system = random.Random(0).randbytes(60_000).hex().encode()  # compresses to about half: a large keyframe
    turns = [b"turn %d: %s" % (turn, bytes(range(32, 127)) * 20) for turn in range(20)]
    body, calls, rows = _growing_session(writer, system, turns)
    assert rows[0][0] == "zstd" and {e for e, _ in rows[1:]} == {"zstd-splice"}
    assert max(n for _, n in rows[1:]) < 1000 < len(body) // 100
    assert [r["request_body"] for r in CaptureReader(tmp_path / "c.db").calls(with_tokens=False)] == \
        [c.request_body for c in calls]


def test_a_keyframe_comes_once_the_deltas_since_the_last_add_up_to_it(tmp_path):
    """A long session: keyframes neither every k calls (calls x context) nor never (unbounded chains).
    Each comes once the deltas since the previous one add up to KEY_SHARE times its size (or the chain is
    CHAIN long), so all keyframes together take at most 1/KEY_SHARE of the deltas' bytes plus the first
    and the last."""
    writer = CaptureWriter(tmp_path / "c.db")
    rng = random.Random(2)
    turns = [rng.randbytes(300).hex().encode() for _ in range(300)]
    _, calls, stored = _growing_session(writer, rng.randbytes(8_000).hex().encode(), turns)
    keyframes = [i for i, (encoding, _) in enumerate(stored) if encoding == "zstd"]
    assert keyframes[0] == 0 and 2 <= len(keyframes) <= 8  # sizes grow geometrically: ~log(300) of them
    for at, nxt in zip(keyframes, keyframes[1:]):
        assert sum(n for _, n in stored[at + 1 : nxt]) >= bodies.KEY_SHARE * stored[at][1] or nxt - at == bodies.CHAIN
        assert nxt - at <= bodies.CHAIN
    deltas = sum(n for encoding, n in stored if encoding == "zstd-splice")
    keyframe_bytes = sum(n for encoding, n in stored if encoding == "zstd")
    capped = sum(stored[nxt][1] for at, nxt in zip(keyframes, keyframes[1:]) if nxt - at == bodies.CHAIN)
    assert keyframe_bytes <= stored[0][1] + deltas / bodies.KEY_SHARE + stored[keyframes[-1]][1] + capped
    assert [r["request_body"] for r in CaptureReader(tmp_path / "c.db").calls(with_tokens=False)] == \
        [c.request_body for c in calls]


def test_a_sessions_first_body_is_a_delta_of_another_sessions_keyframe_when_smaller(tmp_path):
    """The same system prompt and tools open every session: a new session's first body is stored against the
    last keyframe; an unrelated one is a keyframe of its own."""
    writer = CaptureWriter(tmp_path / "c.db")
    rng = random.Random(1)
    prompt = b'{"system": "' + rng.randbytes(20_000) + b'", "messages": ['  # compresses only against itself
    calls = [_start("a0", "a", prompt + b'"task a"]}'), _start("b0", "b", prompt + b'"task b"]}'),
             _start("c0", "c", rng.randbytes(30_000))]
    ids = _write(writer, calls)
    writer.close()
    conn = sqlite3.connect(tmp_path / "c.db")
    rows = conn.execute("SELECT body_encoding, base, length(data) FROM calls JOIN bodies ON body_id = bodies.id "
                        "ORDER BY calls.id").fetchall()
    assert rows[0][:2] == ("zstd", None) and rows[2][:2] == ("zstd", None)
    assert rows[1][:2] == ("zstd-splice", conn.execute("SELECT body_id FROM calls WHERE id=?", (ids[0],)).fetchone()[0])
    assert rows[1][2] < 100
    assert [r["request_body"] for r in CaptureReader(tmp_path / "c.db").calls(with_tokens=False)] == \
        [c.request_body for c in calls]


def test_a_megabyte_body_is_still_a_small_delta(tmp_path):
    """Past zstd level 3's reach (~1 MB) the writer sizes its window and tables: the first bytes of a
    1.5 MB base are still found (random bytes: nothing but the base can compress them)."""
    writer = CaptureWriter(tmp_path / "c.db")
    first = random.Random(0).randbytes(1_500_000)
    calls = [_start("c0", "s", first), _start("c1", "s", first + b"and one more turn" * 10)]
    _write(writer, calls)
    writer.close()
    conn = sqlite3.connect(tmp_path / "c.db")
    assert conn.execute("SELECT max(length(data)) FROM bodies WHERE base IS NOT NULL").fetchone()[0] < 2000
    assert [r["request_body"] for r in CaptureReader(tmp_path / "c.db").calls(with_tokens=False)] == \
        [c.request_body for c in calls]


def test_a_body_whose_write_was_undone_is_no_base(tmp_path):
    """A write that fails after its row was inserted is rolled back to its savepoint: the session's next
    body must not reference that row (it is not there), but the last committed one."""
    writer = CaptureWriter(tmp_path / "c.db")
    big = random.Random(3).randbytes(5000)  # incompressible: a keyframe larger than the deltas after it
    first = _write(writer, [_start("ok1", "s", big)])[0]
    real = writer._bodies.wrote

    def wrote_then_fail(session, row, body, encoded):
        real(session, row, body, encoded)
        if body.endswith(b"y"):
            raise RuntimeError("failed after the insert")

    writer._bodies.wrote = wrote_then_fail
    with pytest.raises(CaptureError, match="after the insert"):
        finish_now(writer, Arrival(_start("bad", "s", big + b"y")), _end())
    second = _write(writer, [_start("ok2", "s", big + b"z")])[0]
    writer.close()
    _assert_based_on(tmp_path / "c.db", second, first, {"ok1": big, "ok2": big + b"z"})


class _FailingCommit:
    """The writer's connection, whose next COMMIT fails (as a full disk or an I/O error makes it)."""

    def __init__(self, conn: sqlite3.Connection):
        self._conn, self.fail = conn, True

    def execute(self, sql: str, *args):
        if sql == "COMMIT" and self.fail:
            self.fail = False
            raise sqlite3.OperationalError("disk I/O error")
        return self._conn.execute(sql, *args)

    def __getattr__(self, name):
        return getattr(self._conn, name)


def test_a_body_whose_transaction_failed_is_no_base(tmp_path, monkeypatch):
    """The COMMIT fails: the bodies of that transaction are no bases; each write is retried alone, and the
    next body references the retried row, which is there. The same for the answers (each its request
    reversed), stored apart here from SMALL bytes on."""
    monkeypatch.setattr(writer_module, "ANSWER_APART", bodies.SMALL)
    writer = CaptureWriter(tmp_path / "c.db")
    big = random.Random(3).randbytes(5000)  # incompressible: a keyframe larger than the deltas after it
    first = _write(writer, [_start("ok1", "s", big)])[0]
    real, writer._conn = writer._conn, _FailingCommit(writer._conn)
    retried = _write(writer, [_start("retried", "s", big + b"y")])[0]
    writer._conn = real
    second = _write(writer, [_start("ok2", "s", big + b"yz")])[0]
    writer.close()
    _assert_based_on(tmp_path / "c.db", second, retried, {"ok1": big, "retried": big + b"y", "ok2": big + b"yz"})
    assert retried != first
    conn = sqlite3.connect(tmp_path / "c.db")
    answer_of = "SELECT response_body_id FROM calls WHERE id=?"
    assert conn.execute(f"SELECT base FROM bodies WHERE id = ({answer_of})", (second,)).fetchone()[0] == \
        conn.execute(answer_of, (retried,)).fetchone()[0]
    answers = {r["call_id"]: r["response_body"] for r in CaptureReader(tmp_path / "c.db").calls(with_tokens=False)}
    assert answers == {"ok1": big[::-1], "retried": (big + b"y")[::-1], "ok2": (big + b"yz")[::-1]}


def _assert_based_on(path, row: int, base: int, bodies_sent: dict[str, bytes]) -> None:
    conn = sqlite3.connect(path)
    body_of = "SELECT body_id FROM calls WHERE id=?"
    assert conn.execute(f"SELECT base FROM bodies WHERE id = ({body_of})", (row,)).fetchone()[0] == \
        conn.execute(body_of, (base,)).fetchone()[0]
    assert {r["call_id"]: r["request_body"] for r in CaptureReader(path).calls(with_tokens=False)} == bodies_sent


def test_deleting_a_call_leaves_every_other_body_readable(tmp_path):
    """Bodies are kept apart from the calls that sent them: a base's call row may go, its body stays."""
    writer = CaptureWriter(tmp_path / "c.db")
    body, calls = b"x" * 5000, []
    for turn in range(6):
        body += b"turn %d " % turn * 50
        calls.append(_start(f"c{turn}", "s", body))
    _write(writer, calls)
    writer.close()
    with sqlite3.connect(tmp_path / "c.db") as conn:
        conn.execute("DELETE FROM calls WHERE call_id IN ('c0', 'c3')")  # the keyframe's row and a middle one
    rows = {r["call_id"]: r["request_body"] for r in CaptureReader(tmp_path / "c.db").calls(with_tokens=False)}
    assert rows == {c.call_id: c.request_body for c in calls if c.call_id not in ("c0", "c3")}


def _responses_stream(n: int, session: str, echo: bytes) -> bytes:
    """An OpenAI Responses stream as polar writes it: the request's tools and settings echoed in three events,
    an answer of its own in between (random ids and text: incompressible apart from the echo)."""
    rng = random.Random(f"{session}-{n}")
    text = rng.randbytes(300).hex().encode()
    envelope = b'{"id":"resp_%s","tools":%s}' % (rng.randbytes(12).hex().encode(), echo)
    return (b"event: response.created\ndata: " + envelope + b"\n\nevent: response.in_progress\ndata: " + envelope +
            b"\n\nevent: response.output_text.delta\ndata: {\"delta\":\"" + text + b"\"}\n\n"
            b"event: response.completed\ndata: " + envelope + b"\n\n")


def test_large_responses_are_stored_against_the_sessions_earlier_answers(tmp_path):
    """What a streamed answer repeats from the one before it (the Responses API's echo of the tools, three
    times in each) is stored once a session; each answer reads back byte for byte, alone or in a scan."""
    rng = random.Random(0)  # a harness's tools: the same on every call; random, so no one answer compresses them away
    echo = json.dumps([{"name": f"tool_{i}", "description": rng.randbytes(1200).hex()} for i in range(4)]).encode()
    writer = CaptureWriter(tmp_path / "c.db")
    answers = {f"{s}{n}": _responses_stream(n, s, echo) for n in range(12) for s in "ab"}

    async def run() -> None:
        for call_id, answer in answers.items():
            call = _start(call_id, call_id[0], b"{}")
            await writer.finish(writer.start(call), _end(response_body=answer))

    asyncio.run(run())
    writer.close()
    reader = CaptureReader(tmp_path / "c.db")
    assert {r["call_id"]: r["response_body"] for r in reader.calls(with_tokens=False)} == answers
    assert all(reader.find_call(c, c[0])["response_body"] == body for c, body in answers.items())
    conn = sqlite3.connect(tmp_path / "c.db")
    rows = conn.execute("SELECT call_id, response_encoding, response_body, length(data) FROM calls "
                        "JOIN bodies ON response_body_id = bodies.id ORDER BY calls.id").fetchall()
    assert len(rows) == len(answers) and all(inline is None for _, _, inline, _ in rows)
    assert rows[0][1] == "zstd" and rows[1][1] == "zstd-splice"  # b0: against a0, the last keyframe of any session
    whole = {call_id: len(bodies.compress(answer)) for call_id, answer in answers.items()}
    # A splice costs about the answer's own text (300 random bytes as hex), not the echo again; keyframes
    # come as for request bodies (bodies.KEY_SHARE), so all together take a fraction of each compressed whole.
    splices = [n for _, e, _, n in rows if e == "zstd-splice"]
    assert max(splices) < 600 < min(whole.values()) / 4
    assert sum(n for *_, n in rows) < sum(whole.values()) / 3


def test_a_response_whose_write_was_undone_is_no_base(tmp_path):
    """A completion whose write fails after its large response was stored is rolled back to its savepoint:
    the session's next answer is encoded against the last committed one, and every committed answer reads."""
    writer = CaptureWriter(tmp_path / "c.db")
    big = random.Random(5).randbytes(bodies.ANSWER_APART + 1000)
    call = _start("ok1", "s", b"{}")
    first = finish_now(writer, Arrival(call), _end(response_body=big))
    with pytest.raises(CaptureError):  # a model name SQLite cannot encode: the UPDATE fails after the body's insert
        finish_now(writer, Arrival(_start("bad", "s", b"{}")), _end(response_body=big + b"y", model="\ud800"))
    second = finish_now(writer, Arrival(_start("ok2", "s", b"{}")), _end(response_body=big + b"z"))
    writer.close()
    conn = sqlite3.connect(tmp_path / "c.db")
    answer_of = "SELECT response_body_id FROM calls WHERE id=?"
    assert conn.execute(f"SELECT base FROM bodies WHERE id = ({answer_of})", (second,)).fetchone()[0] == \
        conn.execute(answer_of, (first,)).fetchone()[0]
    rows = {r["call_id"]: r["response_body"] for r in CaptureReader(tmp_path / "c.db").calls(with_tokens=False)}
    assert rows["ok1"] == big and rows["ok2"] == big + b"z"


def _tools() -> list[dict]:
    return [{"name": f"tool_{i}", "description": "does a thing " * 40,
             "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}
            for i in range(6)]


def test_large_canonical_parts_are_stored_once_and_read_back_unchanged(tmp_path):
    """The tools repeat on every call of every session: stored once, every row reads them back as sent,
    in their own key order, beside small fields kept inline; a large result is compressed and reads back."""
    writer = CaptureWriter(tmp_path / "c.db")
    sent, last = {}, {"a": MessageLog(), "b": MessageLog()}
    for turn in range(5):
        for session in ("a", "b"):
            messages = [{"role": "user", "content": f"{session} {t}"} for t in range(turn + 1)]
            canonical = {"model": "m", "messages": messages, "tools": _tools(), "sampling": {"max_tokens": 9},
                         "metadata": {"user_id": session}}
            end = _end(canonical=canonical, result=json.dumps({"content": f"{session} {turn} " * 400}))
            end.messages = encode_messages(messages, last[session])
            call = _start(f"{session}{turn}", session, b"{}")
            row = finish_now(writer, Arrival(call), end)
            last[session] = end.messages.log(row, messages)
            sent[call.call_id] = canonical
    writer.close()
    read = list(CaptureReader(tmp_path / "c.db").calls(with_tokens=False))
    rows = {r["call_id"]: r["canonical"] for r in read}
    assert rows == sent
    assert all(r["result"] == {"content": f"{r['call_id'][0]} {r['call_id'][1:]} " * 400} for r in read)
    assert all(list(rows[k]) == [*(key for key in sent[k] if key != "messages"), "messages"] for k in rows)
    assert all(list(t) == ["name", "description", "parameters"] for r in rows.values() for t in r["tools"])
    conn = sqlite3.connect(tmp_path / "c.db")
    stored = [json.loads(bodies.unpack_json(c, Dictionaries(conn))) for (c,) in conn.execute("SELECT canonical FROM calls")]
    assert all(c["part_refs"] == ["tools"] for c in stored) and len({c["tools"] for c in stored}) == 1
    (tools,) = conn.execute("SELECT body FROM messages WHERE hash=?", (stored[0]["tools"],)).fetchone()
    assert len(tools) < len(json.dumps(_tools())) / 3  # stored once, compressed
    assert {t for (t,) in conn.execute("SELECT typeof(result) FROM calls")} == {"blob"}


def test_a_database_written_before_linear_bodies_and_parts_still_reads(tmp_path):
    """Rows as the earlier writer stored them: zlib bodies, small raw bodies, the tools inline in
    `canonical`, no body_id column nor bodies table at all. Read-only readers see them as they always did."""
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE calls (id INTEGER PRIMARY KEY, call_id TEXT, session_id TEXT, status TEXT, "
                 "request_headers TEXT, request_body BLOB, body_encoding TEXT, canonical TEXT, result TEXT, "
                 "rewrites TEXT, prompt_len INTEGER, completion_ids BLOB, completion_len INTEGER, t_start REAL, t_end REAL)")
    conn.execute("CREATE TABLE messages (hash TEXT PRIMARY KEY, body TEXT)")
    conn.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT)")
    message = {"content": "hi", "role": "user"}
    conn.execute("INSERT INTO messages VALUES ('h1', ?)", (json.dumps(message),))
    big = b'{"messages": [' + b'"hello", ' * 500 + b'"end"]}'
    canonical = {"model": "m", "tools": _tools(), "message_refs": ["h1"]}
    conn.execute("INSERT INTO calls VALUES (1, 'c1', 's', 'ok', '{}', ?, 'zlib', ?, NULL, NULL, NULL, NULL, NULL, 1.0, 2.0)",
                 (zlib.compress(big, 1), json.dumps(canonical)))
    conn.execute("INSERT INTO calls VALUES (2, 'c2', 's', 'ok', '{}', ?, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 1.0, 2.0)",
                 (b"{}",))
    conn.commit()
    conn.close()
    rows = {r["call_id"]: r for r in CaptureReader(path).calls(with_tokens=False)}
    assert rows["c1"]["request_body"] == big and rows["c2"]["request_body"] == b"{}"
    assert rows["c1"]["canonical"] == {"model": "m", "tools": _tools(), "messages": [message]}
    assert CaptureReader(path).find_call("c1", "s")["request_body"] == big


def test_bodies_written_as_whole_base_deltas_still_read(tmp_path):
    """A database from before splices: a `bodies` table of (id, base, data) whose deltas are zstd against the
    whole base body. Read-only readers rebuild them; a writer adds the splice columns, and a session's
    chain may then go on as splices of an old delta."""
    import zstandard

    path = tmp_path / "old.db"
    writer = CaptureWriter(path)
    writer.close()
    conn = sqlite3.connect(path)
    conn.execute("DROP TABLE bodies")
    conn.execute("CREATE TABLE bodies (id INTEGER PRIMARY KEY, base INTEGER, data BLOB)")
    first = b'{"messages": [' + random.Random(5).randbytes(3000).hex().encode()
    second = first + b', "and a turn"'
    delta = zstandard.ZstdCompressor(level=3, dict_data=zstandard.ZstdCompressionDict(
        first, dict_type=zstandard.DICT_TYPE_RAWCONTENT)).compress(second)
    conn.execute("INSERT INTO bodies VALUES (1, NULL, ?)", (zstandard.ZstdCompressor().compress(first),))
    conn.execute("INSERT INTO bodies VALUES (2, 1, ?)", (delta,))
    for n, (encoding, body_id) in enumerate([("zstd", 1), ("zstd-delta", 2)]):
        conn.execute("INSERT INTO calls (call_id, session_id, status, body_encoding, body_id) VALUES (?, 's', 'ok', ?, ?)",
                     (f"c{n}", encoding, body_id))
    conn.commit()
    conn.close()
    assert [r["request_body"] for r in CaptureReader(path).calls(with_tokens=False)] == [first, second]
    writer = CaptureWriter(path)  # adds the columns; its splice chains start afresh
    third = second + b', "one more"]}'
    _write(writer, [_start("c2", "s", second), _start("c3", "s", third)])
    writer.close()
    assert [r["request_body"] for r in CaptureReader(path).calls(with_tokens=False)] == [first, second, second, third]
    conn = sqlite3.connect(path)
    assert conn.execute("SELECT body_encoding FROM calls WHERE call_id='c3'").fetchone() == ("zstd-splice",)


def test_a_splice_stores_what_lies_between_the_shared_ends():
    """Claude Code sends its system prompt and tools after the messages: a new turn lands in the middle."""
    rng = random.Random(6)
    history, tools = rng.randbytes(50_000).hex().encode(), rng.randbytes(40_000).hex().encode()
    base = b'{"messages": [' + history + b'], "tools": ' + tools + b"}"
    body = b'{"messages": [' + history + b', "a new turn"], "tools": ' + tools + b"}"
    bases = bodies.BodyBases()
    bases.wrote("s", 1, base, bodies.Encoded(b"k" * 1000, "zstd", None))
    bases.commit()
    encoded = bases.encode("s", body)
    assert encoded.encoding == "zstd-splice" and len(encoded.data) < 64
    shared_tail = b'], "tools": ' + tools + b"}"
    assert (encoded.splice.head, encoded.splice.tail) == (len(base) - len(shared_tail), len(shared_tail))
    middle = zstandard_decompress(encoded.data, encoded.splice.dictionary(base))
    assert encoded.splice.join(base, middle) == body


def zstandard_decompress(data: bytes, dictionary: bytes) -> bytes:
    import zstandard

    return zstandard.ZstdDecompressor(dict_data=zstandard.ZstdCompressionDict(
        dictionary, dict_type=zstandard.DICT_TYPE_RAWCONTENT)).decompress(data)


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(base=st.binary(max_size=40).map(lambda b: bytes(x % 3 for x in b)),
       body=st.binary(max_size=40).map(lambda b: bytes(x % 3 for x in b)), lookback=st.integers(0, 50))
def test_a_splice_rebuilds_any_body_from_any_base(monkeypatch, base, body, lookback):
    """Small alphabets: bodies that repeat themselves, a body that is its base's prefix or suffix — the ends
    never overlap, and base head + middle + base tail is the body."""
    monkeypatch.setattr(bodies, "LOOKBACK", lookback)
    head = bodies._shared_head(base, body)
    splice = bodies.Splice.between(base, body, head)
    assert splice.head + splice.tail <= min(len(base), len(body))
    assert splice.join(base, splice.middle(body)) == body
    assert base[: splice.head] == body[: splice.head] and splice.lookback <= min(lookback, splice.head)


def test_a_part_is_stored_anew_when_its_json_differs_where_python_sees_it_equal():
    """The tools come with every call and their last encoding is reused - only for the same JSON: a schema's
    1 then 1.0 then true are equal in Python, and each must be stored as the client wrote it."""
    from polar.capture.records import encode_parts

    seen = []
    for minimum in (1, 1, 1.0, True, 1):
        tools = [{"name": "t", "description": "d" * 300, "parameters": {"type": "object", "minimum": minimum}}]
        _, (part,) = encode_parts({"tools": tools})
        assert json.loads(part.body) == tools and json.dumps(json.loads(part.body)) == json.dumps(tools)
        seen.append(part.digest)
    assert seen[0] == seen[1] == seen[4] and len(set(seen)) == 3


def _agent_body(turns: list[bytes], tools: bytes) -> bytes:
    """Claude Code's layout: the messages, then the system prompt and tools that every call repeats."""
    return b'{"messages": [' + b", ".join(turns) + b'], "tools": ' + tools + b"}"


def _round_robin(bases: bodies.BodyBases, sessions: int, turns: int, turn_bytes: int) -> list[str | None]:
    """Sessions whose conversations only grow, taking turns one after another as lock-step agents do; the
    encoding of every body after each session's first."""
    rng = random.Random(7)
    tools = rng.randbytes(4_000).hex().encode()
    histories: list[list[bytes]] = [[] for _ in range(sessions)]
    seen, owner = [], {}  # body id → its session
    for turn in range(turns):
        for s in range(sessions):
            histories[s].append(b'"' + rng.randbytes(turn_bytes // 2).hex().encode() + b'"')
            body = _agent_body(histories[s], tools)
            encoded = bases.encode(f"s{s}", body)
            owner[len(owner) + 1] = s
            bases.wrote(f"s{s}", len(owner), body, encoded)
            bases.commit()
            if turn:
                own = encoded.base is None or owner[encoded.base.id] == s
                seen.append(encoded.encoding if own else "spliced against another session's body")
    return seen


def test_a_growing_conversation_keeps_one_base():
    """Each body repeats its predecessor whole and adds a turn: the predecessor is superseded, so a session
    that only grows holds one base (its latest), not BASES_PER_SESSION of them."""
    bases = bodies.BodyBases()
    assert set(_round_robin(bases, sessions=3, turns=6, turn_bytes=2_000)) == {"zstd-splice"}
    assert [len(kept) for kept in bases._bases.values()] == [1, 1, 1]
    assert bases._bytes == sum(len(b.body) for kept in bases._bases.values() for b in kept)


def test_sessions_taking_turns_each_splice_against_their_own_last_body():
    """Round-robin turns of as many sessions as the bases' memory holds one body each of: every later body is
    a splice of its own session's last one. When each session kept three bases, the least recently used
    session's went before its next turn and every body after the first was stored whole (as a keyframe or
    against another session's): storage grew with turns × context at 256 agents."""
    sessions, turns, turn_bytes = 40, 5, 4_000
    last_body = 8_000 + 2 + turns * (turn_bytes + 4) + 20
    bases = bodies.BodyBases(max_bytes=int(sessions * last_body * 1.2))
    assert set(_round_robin(bases, sessions, turns, turn_bytes)) == {"zstd-splice"}
    assert len(bases._bases) == sessions


def test_a_branch_keeps_the_base_it_left():
    """A body that replaces much of its base (a sub-agent's own conversation, a rewritten history) does not
    supersede it: both stay bases of the session."""
    rng = random.Random(8)
    tools = rng.randbytes(4_000).hex().encode()
    main = _agent_body([rng.randbytes(20_000).hex().encode()], tools)
    sub = _agent_body([rng.randbytes(20_000).hex().encode()], tools)
    bases = bodies.BodyBases()
    for n, body in enumerate([main, sub], start=1):
        bases.wrote("s", n, body, bases.encode("s", body))
        bases.commit()
    assert [b.id for b in bases._bases["s"]] == [1, 2]
