"""The watchdog's degenerate-repetition check: the span an answer's end repeats, found in one pass."""

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from polar.rollout.watchdog import periodic_tail


def by_every_span(text: str, repeats: int, min_span: int) -> str | None:
    """The definition, read literally: try each span length from the shortest."""
    for span in range(min_span, len(text) // repeats + 1):
        if text.endswith(text[-span:] * repeats):
            return text[-span:]
    return None


def test_periodic_tail():
    span = "I will check the file again. "
    assert periodic_tail("Let me think. " + span * 4, 3, 16) == span
    assert periodic_tail("Let me think. " + span * 2, 3, 16) is None  # twice is not three times
    assert periodic_tail("- a\n- a\n- a\n- a\n", 3, 16) is None  # short repeats (lists) are no loop
    assert periodic_tail("", 3, 16) is None
    assert periodic_tail("abab" * 3, 3, 4) == "abab"  # the shortest span of at least min_span


@settings(max_examples=400, deadline=None)
@given(head=st.text("ab", max_size=12), unit=st.text("ab", min_size=1, max_size=6),
       times=st.integers(0, 5), tail=st.text("ab", max_size=3), repeats=st.integers(2, 4), min_span=st.integers(1, 7))
def test_equals_the_definition(head, unit, times, tail, repeats, min_span):
    text = head + unit * times + tail
    assert periodic_tail(text, repeats, min_span) == by_every_span(text, repeats, min_span)


def test_a_long_answer():
    """An answer of minutes of reasoning: no loop in random text; a loop at its end found."""
    rng = random.Random(7)
    text = "".join(rng.choice("abcdefgh ") for _ in range(300_000))
    assert periodic_tail(text, 3, 16) is None
    loop = "Let me re-read the file. "
    assert periodic_tail(text + loop * 3, 3, 16) == loop
