"""The per-session caches follow one number (polar_hot_sessions), and each says when sessions still taking turns
are dropped: round-robin turns of more sessions than fit would otherwise redo each call's work in silence."""

from __future__ import annotations

import copy
import logging

import numpy as np
import pytest

from polar.capture import bodies
from polar.capture.working_set import AGENT_BODY_BYTES, DEFAULT, HOT_SESSIONS, RECENT_S, Budgets, Evictions
from polar.providers.history import Histories
from polar.sessions.shared_ids import SharedIds
from polar.sessions.state import SessionState, SessionStates, Turn
from tests.providers.test_history import fixture


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_budgets_scale_with_the_sessions_and_keep_the_token_floor():
    assert DEFAULT == Budgets.for_sessions(HOT_SESSIONS)
    assert DEFAULT.history_bytes == DEFAULT.base_bytes == HOT_SESSIONS * AGENT_BODY_BYTES  # ~256 MB
    small, large = Budgets.for_sessions(10), Budgets.for_sessions(5000)
    assert small.history_bytes == 10 * AGENT_BODY_BYTES
    assert small.state_tokens == DEFAULT.state_tokens and small.state_sessions == 4096  # never below the old floor
    assert large.state_sessions == 10_000 and large.state_tokens > DEFAULT.state_tokens
    with pytest.raises(ValueError, match="at least 1"):
        Budgets.for_sessions(0)


def test_a_session_idle_past_the_window_is_dropped_quietly(caplog):
    clock = Clock()
    watch = Evictions("things", clock)
    clock.t += RECENT_S + 1
    with caplog.at_level(logging.WARNING, "polar.capture.working_set"):
        watch.dropped(1000.0)
    assert watch.recent == 0 and not caplog.records


def test_recent_drops_warn_once_a_window_with_their_count(caplog):
    clock = Clock()
    watch = Evictions("things", clock)
    with caplog.at_level(logging.WARNING, "polar.capture.working_set"):
        for _ in range(5):
            watch.dropped(clock.t - 1)
            clock.t += 1
        assert len(caplog.records) == 1 and "things: 1 session(s)" in caplog.records[0].getMessage()
        clock.t += RECENT_S
        watch.dropped(clock.t - 1)
    assert watch.recent == 6 and len(caplog.records) == 2
    assert "things: 5 session(s)" in caplog.records[1].getMessage()  # the 4 unreported and this one
    assert "polar_hot_sessions" in caplog.records[1].getMessage()


def test_histories_say_when_round_robin_turns_outgrow_them():
    route, _, later = fixture("pi")
    histories = Histories(max_bytes=3000)  # three sessions' reads of 1,000 bytes
    for turn in range(2):
        for session in "abcd":  # four take turns: each evicts the one about to call
            route.provider.parse(route, copy.deepcopy(later), histories.get(session, "anthropic", 1000))
    assert histories.evictions.recent == 5  # every get past the third: d, then a, b, c, d again


def test_bases_say_when_round_robin_turns_outgrow_them():
    body = b'{"messages":[' + b"x" * 10_000 + b"]}"
    bases = bodies.BodyBases(max_bytes=2 * len(body) + 100)
    for n, session in enumerate("abcabc"):
        bases.wrote(session, n, body, bases.encode(session, body))
        bases.commit()
    assert bases.evictions.recent == 4 and len(bases._bases) == 2


def test_session_states_say_when_round_robin_turns_outgrow_them():
    states = SessionStates(max_sessions=2)
    for session in "abcabc":
        turn = Turn(row=1, ids=SharedIds.of(np.arange(4, dtype=np.uint32)), prompt_len=2, context_key="", message_keys=[],
                    answer_key="")
        state = SessionState(turns=[turn])
        states._put(session, state)
    assert states.evictions.recent == 4 and len(states) == 2
