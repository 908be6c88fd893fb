"""Small values compressed with zstd dictionaries trained on the database's own values (capture/dictionaries.py):
read back byte for byte, used only once stored, and what they save."""

from __future__ import annotations

import asyncio
import json
import random
import sqlite3
import time

import pytest
import zstandard

from polar.capture import dictionaries
from polar.capture.bodies import unpack_json
from polar.capture.dictionaries import Dictionaries, Packer, decompress
from polar.capture.reader import CaptureReader
from polar.capture.records import CallEnd, CallStart
from polar.capture.writer import CaptureWriter

WORDS = "the model reads a file runs the tests and edits the code until every test passes".split()


def _call(n: int, session: str) -> tuple[CallStart, CallEnd]:
    rng = random.Random(n)
    text = " ".join(rng.choice(WORDS) for _ in range(120))
    headers = {"content-type": "application/json", "anthropic-version": "2023-06-01", "user-agent": "claude-cli/2.1",
               "anthropic-beta": "claude-code-20250219,interleaved-thinking-2025-05-14,context-management-2025-06-27",
               "x-stainless-lang": "js", "x-stainless-package-version": "0.128.0", "x-stainless-runtime": "node",
               "x-api-key": "<redacted>", "content-length": str(900 + n)}
    events = "".join(f'event: content_block_delta\ndata: {{"type":"content_block_delta","index":1,"delta":'
                     f'{{"type":"text_delta","text":"{w} "}}}}\n\n' for w in text.split()[:60])
    start = CallStart(call_id=f"c{n}", session_id=session, provider="anthropic", endpoint="generate", path="/v1/messages",
                      client=None, key_hash=None, request_headers=headers, request_body=json.dumps({"n": n}).encode(),
                      t_start=time.time())
    result = json.dumps({"id": f"r{n}", "model": "m", "content": text, "usage": {"prompt_tokens": n}})
    canonical = {"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": text}]}],
                 "sampling": {"max_tokens": 32000, "temperature": 1.0}, "metadata": {"user_id": f"user_{n % 3:064x}_account__session_{n % 3:08x}"},
                 "tools": [{"name": "Bash", "description": "Run a shell command. " * 20, "parameters": {"type": "object"}}],
                 "thinking": {"enabled": True, "budget_tokens": 31999}}
    end = CallEnd(status="ok", http_status=200, response_body=events.encode(), t_end=time.time(), result=result,
                  canonical=canonical)
    return start, end


def _run(writer: CaptureWriter, calls: list[tuple[CallStart, CallEnd]]) -> None:
    async def go():
        for start, end in calls:
            await writer.finish(writer.start(start), end)
    asyncio.run(go())


def test_values_read_back_and_take_less_once_a_dictionary_is_trained(tmp_path):
    writer = CaptureWriter(tmp_path / "c.db")
    calls = [_call(n, f"s{n % 3}") for n in range(3 * dictionaries.SAMPLES)]
    _run(writer, calls)
    writer.close()
    conn = sqlite3.connect(tmp_path / "c.db")
    kinds = {k for (k,) in conn.execute("SELECT kind FROM dictionaries")}
    assert kinds == {"headers", "canonical", "result", "response", "message"}
    rows = {r["call_id"]: r for r in CaptureReader(tmp_path / "c.db").calls(with_tokens=False)}
    for start, end in calls:
        row = rows[start.call_id]
        assert row["request_headers"] == start.request_headers and row["response_body"] == end.response_body
        assert row["result"] == json.loads(end.result) and row["canonical"]["messages"] == end.canonical["messages"]
    early, late = (conn.execute(f"SELECT avg(length(response_body)), avg(length(result)) FROM calls WHERE id {op} ?",
                                (dictionaries.SAMPLES,)).fetchone() for op in ("<=", ">"))
    assert late[0] < 0.85 * early[0] and late[1] < 0.85 * early[1]  # the real shapes: docs/benchmarks.md
    ids = [zstandard.get_frame_parameters(v).dict_id for (v,) in conn.execute("SELECT response_body FROM calls")]
    assert ids[0] == 0 and ids[-1] in {i for (i,) in conn.execute("SELECT id FROM dictionaries")}
    with pytest.raises(LookupError, match="dictionary"):  # a frame names its dictionary: none given, a clear error
        unpack_json(conn.execute("SELECT result FROM calls ORDER BY id DESC").fetchone()[0])
    assert decompress(conn.execute("SELECT result FROM calls ORDER BY id DESC").fetchone()[0], Dictionaries(conn))


def test_a_dictionary_is_used_only_once_its_transaction_committed(tmp_path):
    """The dictionary's own transaction fails (disk full, say): nothing is compressed with it, everything reads;
    the next commit stores it, and only then is it used."""
    path = tmp_path / "c.db"
    writer = CaptureWriter(path)
    real = writer._packer.store
    failures = []

    def store_failing(conn):
        if not failures:
            failures.append(1)
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("ROLLBACK")  # as a failed COMMIT leaves it: nothing stored
            return
        real(conn)

    writer._packer.store = store_failing
    calls = [_call(n, "s") for n in range(dictionaries.SAMPLES + 20)]
    _run(writer, calls)
    writer.close()
    conn = sqlite3.connect(path)
    stored = {i for (i,) in conn.execute("SELECT id FROM dictionaries")}
    for (value,) in conn.execute("SELECT response_body FROM calls"):
        assert zstandard.get_frame_parameters(value).dict_id in stored | {0}
    assert len(list(CaptureReader(path).calls(with_tokens=False))) == len(calls)


def test_a_writer_uses_the_newest_dictionaries_of_its_database(tmp_path):
    path = tmp_path / "c.db"
    writer = CaptureWriter(path)
    _run(writer, [_call(n, "s") for n in range(dictionaries.SAMPLES + 1)])
    writer.close()
    again = CaptureWriter(path)  # a restart: no new training, the stored dictionaries at once
    assert not again._packer._samples
    _run(again, [_call(1000, "t")])
    again.close()
    conn = sqlite3.connect(path)
    (last,) = conn.execute("SELECT response_body FROM calls ORDER BY id DESC").fetchone()
    assert zstandard.get_frame_parameters(last).dict_id != 0
    assert conn.execute("SELECT count(*) FROM dictionaries").fetchone()[0] == len(dictionaries.KINDS)
    assert [r["call_id"] for r in CaptureReader(path).calls(with_tokens=False)][-1] == "c1000"


def test_a_kind_zstd_cannot_train_on_stays_plain(tmp_path, monkeypatch):
    """Training fails (zstd finds nothing to learn): the values are compressed plainly, training is tried again
    as samples come, and given up at 4x SAMPLES (the samples let go)."""
    tries = []

    def refuse(*args, **kwargs):
        tries.append(1)
        raise zstandard.ZstdError("cannot train")

    monkeypatch.setattr(zstandard, "train_dictionary", refuse)
    conn = sqlite3.connect(tmp_path / "c.db")
    conn.execute("CREATE TABLE dictionaries (id INTEGER PRIMARY KEY, kind TEXT, data BLOB, t_created REAL)")
    packer = Packer(conn)
    for n in range(4 * dictionaries.SAMPLES):
        value = b"value %d " % n * 40
        assert decompress(packer.compress("result", value)) == value
    assert not packer.waiting and "result" not in packer._samples and len(tries) == 3
