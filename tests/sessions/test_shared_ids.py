"""A session's turns hold the ids they share as views of one buffer: the same ids, memory linear in the context."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from polar.canonical import ChatRequest, ChatResult, Message, TextPart
from polar.capture.tokens import common_prefix_len
from polar.sessions.fingerprints import message_fingerprint
from polar.sessions.shared_ids import MAX_PIECES, SharedIds, held_tokens
from polar.sessions.state import SessionState, SessionStates, Turn, new_turn
from tests.conftest import real_template

ids_list = st.lists(st.integers(0, 3), max_size=10)


def _ids(values) -> np.ndarray:
    return np.asarray(values, dtype=np.uint32)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 40), st.integers(0, 12), ids_list), max_size=60), ids_list)
def test_branches_hold_the_same_ids_as_copies_would(steps, probe):
    """Each new turn repeats part of a random earlier one and adds its own ids (past MAX_PIECES a branch is
    joined): every turn reads back its ids, compares as its ids would, and memory counts each buffer once."""
    turns, truth = [SharedIds.of(_ids([1, 2]))], [[1, 2]]
    for pick, cut, rest in steps:
        k = pick % len(turns)
        shared = min(cut, len(truth[k]))
        turns.append(turns[k].branch(shared, _ids(rest)))
        truth.append(truth[k][:shared] + rest)
    probe = _ids(probe)
    for one, expected in zip(turns, truth):
        assert one.array().tolist() == expected and len(one) == len(expected)
        assert len(one.pieces) <= MAX_PIECES
        assert one.common_prefix_len(probe) == common_prefix_len(probe, _ids(expected))
        if expected:
            assert one.last() == expected[-1]
    for a, ta in zip(turns[-8:], truth[-8:]):
        for b, tb in zip(turns[-8:], truth[-8:]):
            assert a.starts_with(b) == (ta[: len(tb)] == tb)
    assert held_tokens(turns) <= sum(len(t) for t in truth) + 2


def test_a_branch_owns_only_what_it_adds():
    parent = SharedIds.of(np.arange(100_000, dtype=np.uint32))
    child = parent.branch(90_000, _ids([7, 8, 9]))
    assert child.pieces[0].base is parent.pieces[0]  # a view, no copy
    assert held_tokens([parent, child]) == 100_003
    caller = np.arange(10, dtype=np.uint32)
    own = SharedIds.of(caller[:5])  # a caller's buffer is copied, never kept or written
    caller[0] = 99
    assert own.array().tolist() == [0, 1, 2, 3, 4]
    with pytest.raises(ValueError):
        parent.branch(100_001, _ids([]))


def _msg(role: str, text: str, reasoning: str | None = None) -> Message:
    return Message(role=role, content=[TextPart(text=text)], reasoning=[reasoning] if reasoning else [])


@pytest.mark.parametrize("template_name", ["qwen3.5-4b", "qwen3-hybrid"])
def test_chat_mode_turns_that_are_not_prefixes_share_memory_with_a_real_template(template_name, tokenizer_dir):
    """A chat-mode session whose client drops the model's reasoning from the turns it sends back (most OpenAI
    chat clients do), rendered by a real chat template: no turn's ids are the next one's prefix, so 16 turns
    were 16 whole-context copies. Now the ids held stay near one context plus what each kept turn adds."""
    from transformers import AutoTokenizer

    from polar.tokens import ChatTemplate

    template = ChatTemplate(AutoTokenizer.from_pretrained(str(tokenizer_dir)), real_template(template_name).read_text())
    states = SessionStates(turns_per_session=16)
    state: SessionState = asyncio.run(states.get("s"))
    messages = [_msg("system", "You are a coding agent. " * 400), _msg("user", "Fix the failing test.")]
    whole, last = [], None
    for k in range(24):
        prompt = template.prompt_ids(messages, enable_thinking=True)
        reasoning, answer = f"Step {k}: I should read file {k}. " * 20, f"Reading file {k}."
        sampled = template.encode(f"{reasoning}\n</think>\n\n{answer}<|im_end|>")
        result = ChatResult(id="r", model="m", created=0, content=answer,
                            prompt_token_ids=prompt, completion_token_ids=sampled)
        request = ChatRequest(model="m", messages=list(messages))
        if last is not None:  # the real template re-renders the earlier turn without its reasoning
            assert last.ids.common_prefix_len(np.asarray(prompt, dtype=np.uint32)) < len(last.ids)
        prompt_arr = np.asarray(prompt, dtype=np.uint32)
        turn = new_turn(k, request, [message_fingerprint(m) for m in messages], result, prompt_arr,
                        state.branch_point(prompt_arr))
        states.record("s", turn, None)
        assert turn.ids.array().tolist() == prompt + sampled
        whole.append(len(prompt) + len(sampled))
        last = turn
        messages += [_msg("assistant", answer), _msg("user", "x = 1\n" * 300)]  # the client drops the reasoning
    assert len(state.turns) == 16
    copies = sum(whole[-16:])
    held = states._tokens
    assert held == state.tokens
    print(f"{template_name}: held {held} ids, last context {whole[-1]}, 16 copies {copies}")
    assert held < 1.3 * whole[-1] and copies > 5 * held, (held, whole[-1], copies)


def test_a_rebuilt_session_shares_memory_too(tmp_path):
    """After a restart the turns are read back from captures.db as branches of each other."""
    from tests.support.captures import Recorder

    rec = Recorder(tmp_path / "c.db")
    base = list(range(5000))
    for k in range(6):  # each turn re-renders the one before (a changed id where its reasoning was)
        prompt = base + [9000 + k] * 3
        request = ChatRequest(model="m", messages=[_msg("user", f"q{k}")])
        result = ChatResult(id="r", model="m", created=0, content="a", prompt_token_ids=prompt,
                            completion_token_ids=[1, 2])
        canonical = request.model_dump(mode="json", exclude_none=True)
        rec.call("s", prompt, [1, 2], messages=canonical["messages"],
                 result=result.model_dump(mode="json", exclude={"prompt_token_ids", "completion_token_ids"}))
        base = prompt + [100 + k]
    rec.close()
    state = asyncio.run(SessionStates(rec.reader.recent_calls).get("s"))
    assert len(state.turns) == 6 and all(isinstance(t, Turn) for t in state.turns)
    assert state.tokens < len(state.turns[-1].ids) + 6 * 10
