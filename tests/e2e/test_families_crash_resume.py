"""The families whose continuation joins ids in their own way, through a gateway killed (SIGKILL) between turns and
started again on the same capture database: GLM (its turn ends on the next turn's role token, which the next prompt
must not write twice) and gpt-oss (harmony's history rule applied to the ids after a final answer). The session's
state is rebuilt from the database on its next call; every prompt must still start with the previous prompt +
sampled ids, exactly as without the kills (tests/e2e/test_token_faithful_families.py, same double and template)."""

from __future__ import annotations

import signal
import uuid

import pytest

from tests.e2e.sessions import DRIVERS
from tests.e2e.test_token_faithful_families import assert_token_faithful, family, family_steps  # noqa: F401

pytestmark = pytest.mark.slow  # outside scripts/test_fast: processes killed and restarted

KILL_AFTER = (4, 6)  # killed and restarted after these turns: a final answer (then a user message), a cut turn


@pytest.mark.parametrize(("family", "provider"), [("glm-4.6", "anthropic"), ("gpt-oss", "openai_responses")],
                         indirect=["family"])
def test_a_family_session_survives_sigkill_between_turns(family, provider):  # noqa: F811
    stack = family
    session = f"crash-{stack.template}-{provider}-{uuid.uuid4().hex[:6]}"
    stack.script(rules=[{"match": "[session:tf]", "steps": family_steps(stack.template, True)}])
    kills = []

    def restart(turn: int) -> None:
        if turn in KILL_AFTER:
            stack.proxy.proc.send_signal(signal.SIGKILL)
            stack.proxy.proc.wait(10)
            stack.proxy.start()
            kills.append(turn)

    DRIVERS[provider](stack.url, session, True, between=restart)
    assert kills == list(KILL_AFTER)
    assert_token_faithful(stack, stack.rows(session))
