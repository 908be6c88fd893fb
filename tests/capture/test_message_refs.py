"""A row's message references stored against its parent row's (linear in turns, not turns x history),
read back exactly: in a scan, alone, with the reader's memo squeezed, across whole-list rows."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from polar.capture import reader as reader_module
from polar.capture import records
from polar.capture.bodies import unpack_json
from polar.capture.dictionaries import Dictionaries
from polar.capture.reader import CaptureReader
from polar.capture.records import REFS_CHAIN, CallEnd, CallStart, MessageLog, encode_messages
from polar.capture.writer import CaptureWriter


def _write(writer: CaptureWriter, session: str, call_id: str, messages: list[dict], last: MessageLog) -> MessageLog:
    """One call as the gateway writes it: references against the session's last committed call, which it
    becomes once this row has committed."""
    start = CallStart(call_id=call_id, session_id=session, provider="test", endpoint="generate", path="/t",
                      client=None, key_hash=None, request_headers={}, request_body=b"{}", t_start=time.time())
    end = CallEnd(status="ok", http_status=200, response_body=b"{}", t_end=time.time(),
                  canonical={"model": "m", "messages": messages})
    end.messages = encode_messages(messages, last)

    async def both() -> int:
        return await writer.finish(writer.start(start), end)

    return end.messages.log(asyncio.run(both()), messages)


def _message(i: int, text: str = "") -> dict:
    return {"role": "user" if i % 2 == 0 else "assistant", "content": [{"type": "text", "text": text or f"m{i}"}]}


# What a client's next request does to its session's last one: a turn appended, the history cut (a
# compaction), one message rewritten, a sub-agent's fresh conversation, the same request again.
_op = st.one_of(
    st.tuples(st.just("append"), st.integers(1, 4)),
    st.tuples(st.just("cut"), st.floats(0, 1)),
    st.tuples(st.just("edit"), st.floats(0, 1), st.text(max_size=20)),
    st.tuples(st.just("fresh"), st.integers(0, 3)),
    st.tuples(st.just("again"),),
)


def _apply(messages: list[dict], op: tuple, n: int) -> list[dict]:
    kind = op[0]
    if kind == "append":
        return messages + [_message(len(messages) + i, f"t{n}.{i}") for i in range(op[1])]
    if kind == "cut":
        return messages[: int(op[1] * len(messages))]
    if kind == "edit" and messages:
        at = min(int(op[1] * len(messages)), len(messages) - 1)
        return messages[:at] + [_message(at, "edited " + op[2])] + messages[at + 1 :]
    if kind == "fresh":
        return [_message(i, f"fresh {n}") for i in range(op[1])]
    return list(messages)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])
@given(ops=st.lists(st.tuples(st.sampled_from("ab"), _op), min_size=1, max_size=60),
       chain=st.sampled_from([1, 2, 3, REFS_CHAIN]), memo=st.sampled_from([1, 7, reader_module.MEMO_REFS]))
def test_message_lists_round_trip(tmp_path_factory, monkeypatch, ops, chain, memo):
    """Random edit sequences over two interleaved sessions: every row's canonical messages read back as
    sent, in a scan and alone, with the reader's memo of reference lists as small as one row; no row's
    references lean on more than `chain` - 1 parents."""
    monkeypatch.setattr(records, "REFS_CHAIN", chain)
    monkeypatch.setattr(reader_module, "MEMO_REFS", memo)
    path = tmp_path_factory.mktemp("refs") / "c.db"
    writer = CaptureWriter(path)
    messages: dict[str, list[dict]] = {"a": [], "b": []}
    last = {"a": MessageLog(), "b": MessageLog()}
    sent: dict[str, tuple[str, list[dict]]] = {}
    for n, (session, op) in enumerate(ops):
        messages[session] = _apply(messages[session], op, n)
        last[session] = _write(writer, session, f"c{n}", messages[session], last[session])
        sent[f"c{n}"] = (session, messages[session])
    writer.close()

    reader = CaptureReader(path)
    scanned = {r["call_id"]: r["canonical"]["messages"] for r in reader.calls(with_tokens=False)}
    assert scanned == {k: m for k, (_, m) in sent.items()}
    for call_id, (session, sent_messages) in reversed(sent.items()):  # alone, the newest first: nothing memoised
        assert reader.find_call(call_id, session)["canonical"]["messages"] == sent_messages
    with sqlite3.connect(path) as conn:
        stored = {rid: json.loads(unpack_json(c, Dictionaries(conn))) for rid, c in conn.execute("SELECT id, canonical FROM calls")}
    for row_id in stored:
        depth, cur = 0, row_id
        while base := stored[cur].get("message_base"):
            assert base[0] < cur
            depth, cur = depth + 1, base[0]
        assert depth < chain


def test_a_growing_session_stores_each_reference_about_once(tmp_path):
    """500 turns of two new messages each: a row lists its two new references, but a few list them all
    (each after as many have been listed since the last one: their lengths double) - linear in turns,
    not turns x history."""
    writer = CaptureWriter(tmp_path / "c.db")
    messages, last = [], MessageLog()
    for turn in range(500):
        messages = messages + [_message(2 * turn), _message(2 * turn + 1)]
        last = _write(writer, "s", f"c{turn}", messages, last)
    writer.close()
    with sqlite3.connect(tmp_path / "c.db") as conn:
        lists = [json.loads(unpack_json(c, Dictionaries(conn))) for (c,) in conn.execute("SELECT canonical FROM calls ORDER BY id")]
    whole = [i for i, c in enumerate(lists) if "message_base" not in c]
    assert len(whole) <= 2 + 500 // REFS_CHAIN + 9  # log2(1000) doublings, and the depth bound
    assert all(len(lists[i]["message_refs"]) == 2 for i in range(500) if i not in whole)
    listed = sum(len(c["message_refs"]) for c in lists)
    assert listed <= 3 * 1000  # each reference once, the whole lists at most twice more
    rows = list(CaptureReader(tmp_path / "c.db").calls(with_tokens=False))
    assert rows[-1]["canonical"]["messages"] == messages


def test_after_a_restart_the_next_row_lists_its_references_whole(tmp_path):
    """A session rebuilt from the database does not know how far its last row leans: the next row
    starts a new run (it would otherwise be free to exceed REFS_CHAIN)."""
    rebuilt = MessageLog.rebuilt(5, [_message(0), _message(1)])
    refs = encode_messages([_message(0), _message(1), _message(2)], rebuilt)
    assert refs.base is None and refs.depth == 0 and refs.stored() == {"message_refs": refs.refs}
    assert refs.refs[:2] == [d for _, d in rebuilt.items] and len(refs.new) == 1


def test_a_missing_parent_row_is_a_clear_error(tmp_path):
    writer = CaptureWriter(tmp_path / "c.db")
    first = _write(writer, "s", "c0", [_message(0)], MessageLog())
    _write(writer, "s", "c1", [_message(0), _message(1)], first)
    writer.close()
    with sqlite3.connect(tmp_path / "c.db") as conn:
        conn.execute("DELETE FROM calls WHERE call_id = 'c0'")
    with pytest.raises(LookupError, match=f"capture row {first.row} .*is missing"):
        CaptureReader(tmp_path / "c.db").find_call("c1", "s")
