"""Per-session state: one LRU policy, updated after commits, rebuilt lazily from the capture database."""

from __future__ import annotations

import asyncio

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from polar.canonical import ChatRequest, ChatResult, Message, TextPart
from polar.capture.records import MessageLog
from polar.sessions.fingerprints import message_fingerprint
from polar.sessions.shared_ids import SharedIds
from polar.sessions.state import SessionStates, Turn, new_turn
from tests.support.captures import Recorder


def _ids(values) -> np.ndarray:
    return np.asarray(values, dtype=np.uint32)


def _msg(role: str, text: str) -> Message:
    return Message(role=role, content=[TextPart(text=text)])


def _request(*messages: Message) -> ChatRequest:
    return ChatRequest(model="m", messages=list(messages))


def _result(text: str, prompt: list[int], sampled: list[int]) -> ChatResult:
    return ChatResult(id="r", model="m", created=0, content=text, prompt_token_ids=prompt, completion_token_ids=sampled)


def _record(rec: Recorder, session: str, request: ChatRequest, result: ChatResult) -> int:
    canonical = request.model_dump(mode="json", exclude_none=True)
    return rec.call(session, result.prompt_token_ids, result.completion_token_ids, messages=canonical["messages"],
                    result=result.model_dump(mode="json", exclude={"prompt_token_ids", "completion_token_ids"}))


def test_a_session_is_rebuilt_from_the_database_after_a_restart(tmp_path):
    """What a gateway killed between turns leaves behind is enough to extend the session token for token."""
    rec = Recorder(tmp_path / "c.db")
    first = _request(_msg("system", "be brief"), _msg("user", "hi"))
    row1 = _record(rec, "s", first, _result("hello", [1, 2, 3], [10, 11, 99]))
    second = _request(*first.messages, _msg("assistant", "hello"), _msg("user", "more"))
    row2 = _record(rec, "s", second, _result("sure", [1, 2, 3, 10, 11, 99, 4, 5], [12, 99]))
    rec.close()

    states = SessionStates(rec.reader.recent_calls)  # a new process: nothing in memory

    async def run():
        a, b = await asyncio.gather(states.get("s"), states.get("s"))  # one rebuild for both
        return a, b

    state, same = asyncio.run(run())
    assert state is same and [t.row for t in state.turns] == [row2]  # the first turn is the second's prefix
    turn = state.turns[0]
    assert turn.ids.array().tolist() == [1, 2, 3, 10, 11, 99, 4, 5, 12, 99] and turn.prompt_len == 8
    third = _request(*second.messages, _msg("assistant", "sure"), _msg("user", "again"))
    ext, why = state.extension(third, [message_fingerprint(m) for m in third.messages])
    assert why == "" and ext.turn is turn and [m.text() for m in ext.new_messages] == ["again"]
    assert state.lineage([1, 2, 3, 10, 11, 99, 4, 5, 12, 99, 6]).parent == row2
    assert state.messages.row == row2 and [d for d, _ in state.messages.items] == second.model_dump(mode="json", exclude_none=True)["messages"]
    assert row1 < row2


def test_state_changes_only_through_record_and_unknown_sessions_are_left_to_rebuild():
    states = SessionStates()
    states.record("never-read", Turn(1, SharedIds.of([1]), 1, "", [], ""), None)
    assert len(states) == 0  # its next call reads it from the database, this row included
    state = asyncio.run(states.get("s"))
    request = _request(_msg("user", "hi"))
    keys = [message_fingerprint(m) for m in request.messages]
    log = MessageLog(7, 0, [({"role": "user"}, "h")])
    states.record("s", new_turn(7, request, keys, _result("yo", [1, 2], [3])), log)
    assert [t.row for t in state.turns] == [7] and state.messages is log


def test_one_lru_policy_bounds_sessions_turns_and_tokens():
    states = SessionStates(max_sessions=2, turns_per_session=2, max_tokens=10)

    async def touch(name: str):
        await states.get(name)

    for name in ("a", "b"):
        asyncio.run(touch(name))
    for row in range(3):  # unrelated lineages (sub-agents): at most two kept
        states.record("a", Turn(row, SharedIds.of([100 + row]), 1, "", [], ""), None)
    assert [t.row for t in asyncio.run(states.get("a")).turns] == [1, 2]
    asyncio.run(touch("c"))  # "b" is the least recently used
    assert asyncio.run(states.get("a")).turns and len(states) == 2
    states.record("a", Turn(9, SharedIds.of(np.arange(20, dtype="<u4")), 10, "", [], ""), None)  # over max_tokens
    assert len(states) == 1  # the least recently used went first, the active session stays


def test_an_unreadable_database_means_a_re_render_that_says_why():
    def broken(session: str, n: int):
        raise OSError("disk I/O error")

    state = asyncio.run(SessionStates(broken).get("s"))
    request = _request(_msg("user", "hi"), _msg("assistant", "yo"), _msg("user", "more"))
    ext, why = state.extension(request, [message_fingerprint(m) for m in request.messages])
    assert ext is None and why == "its earlier turns could not be read from the capture database (disk I/O error)"


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(st.integers(0, 2), max_size=12), max_size=6), st.lists(st.integers(0, 2), max_size=14))
def test_lineage_is_the_longest_shared_prefix_and_add_drops_exactly_the_prefixes(earlier, prompt):
    """The newest turn is tried first and turns that cannot share more are skipped: the length found is still
    the longest over every turn; a new turn drops exactly the turns whose ids are its prefix."""
    from polar.capture.tokens import common_prefix_len
    from polar.sessions.state import SessionState

    state = SessionState()
    for row, ids in enumerate(earlier):
        state.turns.append(Turn(row, SharedIds.of(_ids(ids)), len(ids), "k", [], "a"))
    ids = np.asarray(prompt, dtype=np.uint32)
    best = state.lineage(ids)
    assert best.prefix_len == max([common_prefix_len(ids, t.ids.array()) for t in state.turns], default=0)
    assert best.parent is None if best.prefix_len == 0 else \
        common_prefix_len(ids, state.turns[best.parent].ids.array()) == best.prefix_len
    before = list(state.turns)
    state.add(Turn(99, SharedIds.of(ids), len(ids), "k", [], "a"), keep=100)
    dropped = [t for t in before if t not in state.turns]
    assert all(len(t.ids) <= len(ids) and list(ids[: len(t.ids)]) == t.ids.array().tolist() for t in dropped)
    assert not any(len(t.ids) <= len(ids) and list(ids[: len(t.ids)]) == t.ids.array().tolist() for t in state.turns[:-1])
