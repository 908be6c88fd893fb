"""SegmentIds: whole prompts tokenized with the ids of pieces seen before reused give exactly the ids of
tokenizing them whole — random text full of special tokens, NFC marks and CRLF, every reference template's
agent-shaped conversation as sessions that share a system prompt — and reuse turns itself off wherever the
cut would not be exact (a marker that is not an added token, strips whitespace or overlaps another; a
tokenizer told to split special tokens; a first call whose ids differ)."""

from __future__ import annotations

import threading

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import AddedToken

from polar.tokens import ChatTemplate
from polar.tokens.encoder import ids_encoder
from polar.tokens.segments import SegmentIds, marker_splits_exactly
from tests.tokens.conftest import TEMPLATES
from tests.tokens.test_encoder import TRICKY

MARKER = "<|im_start|>"


def _reference(tokenizer, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


@pytest.fixture(scope="module")
def shared(tokenizer):
    """One SegmentIds across the random examples, so later ones reuse earlier pieces (checked by the test, not itself)."""
    return SegmentIds.for_tokenizer(tokenizer, ids_encoder(tokenizer), MARKER, check=0)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pieces=st.lists(st.one_of(st.text(st.characters(exclude_categories=["Cs"]), max_size=40),
                                 st.sampled_from([*TRICKY, MARKER, MARKER + "user\n", MARKER + "system\nYou are"])),
                       max_size=30))
def test_random_text_gives_the_whole_texts_ids(tokenizer, shared, pieces):
    text = "".join(pieces)
    assert shared(text) == _reference(tokenizer, text)
    assert shared(text) == _reference(tokenizer, text)  # every piece known now


def _agent_session(system: str, task: str, turns: int) -> tuple[list[dict], list[dict]]:
    tools = [{"type": "function", "function": {"name": name, "description": f"{name}: run it. ‘Quoted’ — ünïcode.",
                                               "parameters": {"type": "object",
                                                              "properties": {"cmd": {"type": "string"}}}}}
             for name in ("bash", "read", "edit", "grep")]
    messages = [{"role": "system", "content": system}, {"role": "user", "content": task}]
    for t in range(turns):
        messages.append({"role": "assistant", "content": f"Step {t}.", "reasoning_content": f"Look at {t} first.",
                         "tool_calls": [{"id": f"c{t}", "type": "function",
                                         "function": {"name": "bash", "arguments": f'{{"cmd": "pytest -x t{t}"}}'}}]})
        messages.append({"role": "tool", "tool_call_id": f"c{t}",
                         "content": f"E   AssertionError: b'\\r\\n' != b'\\n' ({t})\r\n\t<|im_start|> as text 修复\n" * 20})
    return messages, tools


@pytest.mark.parametrize("name", TEMPLATES)
def test_each_templates_sessions_give_the_whole_prompts_ids(tokenizer, name):
    """A fresh ChatTemplate per template (its reuse starts empty): the real templates' prompts, three sessions
    sharing the system prompt and tools, each growing; the second session's opening is reused, not re-tokenized."""
    from tests.tokens.conftest import PROJECT_TEMPLATE, real_template

    text = PROJECT_TEMPLATE.read_text() if name == "project" else real_template(name).read_text()
    template = ChatTemplate(tokenizer, text, name=name)
    assert template.turn_marker() == MARKER
    whole = template.whole_encoder()
    assert isinstance(whole, SegmentIds)
    system = "You are a careful coding agent.\n\nBe brief. " + "Follow the repository's conventions. " * 200
    for session, turns in ((0, 3), (1, 1), (1, 6), (2, 0)):
        messages, tools = _agent_session(system, f"Task {session}: fix the failing test — 👀", turns)
        prompt = template.render(messages, tools, True)
        before = whole.reused_ids
        assert template.prompt_ids(messages, tools) == _reference(tokenizer, prompt)
        if session > 0:  # the system prompt and tools (thousands of ids) came from an earlier session
            assert whole.reused_ids - before > 1000


def test_the_marker_must_be_an_added_token_that_touches_nothing(tokenizer_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    assert marker_splits_exactly(tokenizer, MARKER)
    assert not marker_splits_exactly(tokenizer, "ing")  # not an added token: cut inside words
    tokenizer.add_tokens([AddedToken("<strip>", rstrip=True), AddedToken("<|im_start|>x", special=True),
                          AddedToken("<lone>", normalized=True)])
    assert not marker_splits_exactly(tokenizer, "<strip>")  # eats the whitespace after it
    assert not marker_splits_exactly(tokenizer, MARKER)  # another added token starts with it
    assert not marker_splits_exactly(tokenizer, "<lone>")  # matched after NFC: the raw text's cut could move
    assert SegmentIds.for_tokenizer(tokenizer, ids_encoder(tokenizer), MARKER) is None


def test_split_special_tokens_encodes_whole(tokenizer_dir):
    """transformers' `split_special_tokens` makes the marker plain text: every call is the whole text's encoding."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    reuse = SegmentIds.for_tokenizer(tokenizer, ids_encoder(tokenizer), MARKER, check=0)
    text = f"{MARKER}system\nhi<|im_end|>\n{MARKER}user\nyo<|im_end|>\n"
    assert reuse(text) == _reference(tokenizer, text)
    tokenizer.split_special_tokens = True
    ids = reuse(text)
    assert ids == _reference(tokenizer, text) and tokenizer.convert_tokens_to_ids(MARKER) not in ids


def test_ids_that_differ_on_a_checked_call_turn_reuse_off(tokenizer):
    """Cut where the tokenizer does not (inside words): the first call is compared, answered whole, and reuse stops."""
    mismatches = []
    reuse = SegmentIds(ids_encoder(tokenizer), "ing", check=1, on_mismatch=lambda: mismatches.append(1))
    text = "the testing of something interesting"
    assert reuse(text) == _reference(tokenizer, text) and mismatches == [1]
    assert reuse.held_ids == 0
    assert reuse(text + " again") == _reference(tokenizer, text + " again") and reuse.held_ids == 0


def test_what_is_held_stays_under_its_bound(tokenizer):
    reuse = SegmentIds(ids_encoder(tokenizer), MARKER, max_ids=300, check=0)
    for i in range(40):
        text = f"{MARKER}user\nmessage {i} " + "word " * i + f"<|im_end|>\n{MARKER}assistant\n"
        assert reuse(text) == _reference(tokenizer, text)
        assert reuse.held_ids <= 300
    assert reuse.held_ids > 0


def test_threads_rendering_at_once_get_their_own_ids(tokenizer):
    """Whole prompts are tokenized in worker threads; pieces shared between them come back intact."""
    reuse = SegmentIds(ids_encoder(tokenizer), MARKER, max_ids=5_000, check=0)
    texts = [f"{MARKER}system\nshared prompt " * 30 + f"{MARKER}user\ntask {i} " + "x y z " * (i % 17) for i in range(60)]
    wrong: list[int] = []

    def work(offset: int) -> None:
        for i in range(offset, offset + 60):
            text = texts[i % 60]
            if reuse(text) != _reference(tokenizer, text):
                wrong.append(i)

    threads = [threading.Thread(target=work, args=(k * 7,)) for k in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not wrong
