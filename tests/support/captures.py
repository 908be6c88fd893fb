"""Writing capture rows the way the gateway does (arrival → completion, prompts stored against the
session's earlier sequences), for tests that need a real capture database with chosen contents."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from polar.capture.bodies import unpack
from polar.capture.reader import CaptureReader
from polar.capture.records import CallEnd, CallStart, TokenRecord, encode_messages
from polar.capture.writer import Arrival, CaptureWriter
from polar.sessions.state import SessionState, Turn


def finish_now(writer: CaptureWriter, arrival: Arrival, end: CallEnd) -> int:
    """A call's completion written from outside any event loop (the writer's futures need one): its row id."""
    async def run() -> int:
        return await writer.finish(arrival, end)

    return asyncio.run(run())


class Recorder:
    def __init__(self, path: Path, synchronous: str = "FULL"):
        self.path = path
        self.writer = CaptureWriter(path, synchronous=synchronous)
        self.reader = CaptureReader(path)
        self._sessions: dict[str, SessionState] = {}
        self._closed = False
        self._n = sum(1 for _ in self.reader.calls(with_tokens=False))  # call ids c0001… as row ids were

    def close(self) -> None:
        """Stop the writer (once), e.g. before another process opens the database."""
        if not self._closed:
            self._closed = True
            self.writer.close()

    def call(
        self,
        session: str,
        prompt: list[int],
        completion: list[int],
        messages: list[dict] | None = None,
        finish: str = "stop",
        mode: str = "token-faithful",
        logprobs: list[float] | None = None,
        metadata: dict | None = None,
        policy: int | None = None,
        result: dict | None = None,
        provider: str = "test",
        no_logprobs: bool = False,
        continues: str | None = None,
    ) -> int:
        state = self._sessions.setdefault(session, SessionState())
        if logprobs is None and not no_logprobs:
            logprobs = [-0.25 - i / 100 for i in range(len(completion))]
        branch = state.branch_point(prompt)
        tokens = TokenRecord(prompt, completion, logprobs, branch.lineage)
        end = self._end("ok", messages, metadata, state, continues=continues, finish_reason=finish, prompt_mode=mode, policy_version=policy,
                        model="test-model", tokens=tokens, result=json.dumps(result) if result else None)
        row_id = self._write(session, end, provider, state)
        state.add(Turn(row_id, branch.hold(prompt, completion), len(prompt), "", [], ""), keep=16)
        return row_id

    def fail(self, session: str, messages: list[dict] | None = None, status: str = "error",
             error: str = "scripted failure", provider: str = "test") -> int:
        state = self._sessions.setdefault(session, SessionState())
        end = self._end(status, messages, None, state, error_kind="upstream", error=error)
        return self._write(session, end, provider, state)

    def count_tokens(self, session: str) -> int:
        """An ok call that samples nothing (a token count): no token columns."""
        return self._write(session, CallEnd(status="ok", http_status=200, response_body=b"{}", t_end=time.time()), "test")

    def rows(self) -> list[dict]:
        return list(self.reader.calls())

    def _end(self, status, messages, metadata, state, continues=None, **fields) -> CallEnd:
        end = CallEnd(status=status, http_status=200 if status == "ok" else 502, response_body=b"", t_end=time.time(),
                      **fields)
        if messages is not None:
            end.canonical = {"model": "test-model", "messages": messages, **({"metadata": metadata} if metadata else {}),
                             **({"continues": continues} if continues else {})}
            end.messages = encode_messages(messages, state.messages)
        return end

    def _write(self, session: str, end: CallEnd, provider: str, state: SessionState | None = None) -> int:
        self._n += 1
        start = CallStart(call_id=f"c{self._n:04d}", session_id=session, provider=provider,
                          endpoint="generate", path="/test", client=None, key_hash=None, request_headers={},
                          request_body=b"{}", t_start=time.time())

        async def both() -> int:
            return await self.writer.finish(self.writer.start(start), end)

        # A thread of its own: a test may run while another loop runs in this one (Playwright's sync API).
        with ThreadPoolExecutor(1) as pool:
            row_id = pool.submit(asyncio.run, both()).result()
        if state is not None and end.messages is not None:  # as the gateway: once the row has committed
            state.messages = end.messages.log(row_id, end.canonical["messages"])
        return row_id


def rewrite_completion(db: Path, row_id: int, edit) -> list[int]:
    """Tamper with a stored row's sampled ids as someone editing the database would: `edit(ids, logprobs)`
    (decoded, whatever the row's encoding) returns the new ids and logprobs, written back as they are
    (completion_encoding NULL: it covers both columns). Returns the new ids."""
    conn = sqlite3.connect(db)
    blob, lp_blob, encoding = conn.execute(
        "SELECT completion_ids, completion_logprobs, completion_encoding FROM calls WHERE id=?", (row_id,)).fetchone()
    ids = np.frombuffer(unpack(blob, encoding, "test"), dtype="<u4").copy()
    logprobs = None if lp_blob is None else np.frombuffer(unpack(lp_blob, encoding, "test"), dtype="<f4").copy()
    ids, logprobs = edit(ids, logprobs)
    ids = np.asarray(ids, dtype="<u4")
    conn.execute("UPDATE calls SET completion_ids=?, completion_len=?, completion_logprobs=?, completion_encoding=NULL "
                 "WHERE id=?", (ids.tobytes(), len(ids),
                                None if logprobs is None else np.asarray(logprobs, dtype="<f4").tobytes(), row_id))
    conn.commit()
    conn.close()
    return ids.tolist()
