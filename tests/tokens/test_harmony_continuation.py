"""Token-faithful continuation on gpt-oss's real harmony template, over gpt-oss's real vocabulary (o200k_harmony, from
the `openai-harmony` package: tests/support/harmony_vocab.py) and over a stand-in (Qwen3.5's plus harmony's special
tokens), which the e2e sessions use.

Within a tool loop the next prompt is the previous prompt + the exact sampled ids (ending `<|call|>`) + the tool
results as the template writes them, named after the sampled call; it equals a full render of the same history.
After a final answer (ending `<|return|>`) and a new message, the template's history rule is applied to the ids
(analysis cut out, `<|return|>` → `<|end|>`, no id re-encoded): the prompt equals a full render and starts a new
trajectory segment (polar/tokens/harmony_turns.py).
"""

from __future__ import annotations

import numpy as np
import pytest

from polar.tokens.harmony_turns import apply_history_rule
from polar.tokens.template import ChatTemplate
from tests.conftest import family_template
from tests.support.harmony_vocab import harmony_vocab_dir
from tests.support.stand_in import END_TOKENS, stand_in_tokenizer
from tests.tokens.test_template import SHAPES, TOOLS, shape


# o200k_harmony is built from openai-harmony in the vLLM venv (once, into the cache): marked as needing it.
@pytest.fixture(scope="module", params=[pytest.param("o200k_harmony", marks=pytest.mark.vllm), "stand-in"])
def harmony(request, tokenizer_dir):
    if request.param == "o200k_harmony":
        ct = ChatTemplate.from_dir(harmony_vocab_dir(), family_template("gpt-oss"))
        assert ct.encode("<|start|>assistant<|channel|>final<|message|>hi<|return|>") == [
            200006, 173781, 200005, 17196, 200008, 3686, 200002]  # gpt-oss's own ids
        assert sorted(ct.eos_token_ids) == [199999, 200002, 200012]
        return ct
    tok = stand_in_tokenizer(tokenizer_dir, "harmony")
    ends = [tok.convert_tokens_to_ids(t) for t in END_TOKENS["harmony"]]
    return ChatTemplate(tok, family_template("gpt-oss").read_text(), eos_token_ids=ends, name="gpt-oss")


def sampled_text(ct: ChatTemplate, before: list[dict], msg: dict) -> str:
    """What the model samples after the generation prompt for `msg` (as the template writes that turn last)."""
    head = before[:2]  # system and user: the turn as sampled, before any later history rule touches it
    prompt = ct.render(head, TOOLS, True)
    whole = ct.render([*head, msg], TOOLS, False)
    assert whole.startswith(prompt)
    return whole[len(prompt) :]


@pytest.mark.parametrize("thinking", [True, False], ids=["reasoning", "no-reasoning"])
@pytest.mark.parametrize("shape_name", SHAPES)
def test_harmony_continuation_equals_the_full_render(harmony, shape_name, thinking):
    ct = harmony
    before, msg, new = shape(shape_name, thinking)
    prompt_ids = ct.encode(ct.render(before, TOOLS, True))
    sample = sampled_text(ct, before, msg)
    sampled_ids = ct.encode(sample)
    calls = [c["function"]["name"] for c in msg.get("tool_calls", [])]
    assert ct.decode(sampled_ids[-1:]) == ("<|call|>" if calls else "<|return|>")

    cont = ct.continuation(new, TOOLS, None, previous_ended_with_eos=True, last_id=sampled_ids[-1],
                           previous_calls=calls)
    assert cont.failure is None and not cont.closed_truncated_turn
    full_ids = ct.encode(ct.render([*before, msg, *new], TOOLS, True))
    if calls:  # a tool loop: the prompt extends the last one exactly
        assert not cont.history_rule
        assert prompt_ids + sampled_ids + cont.ids == full_ids
        assert cont.text.startswith(f"<|start|>functions.{calls[0]} to=assistant<|channel|>commentary<|message|>")
    else:  # a final answer, then a user message: the history rule on the ids, a new segment
        assert cont.history_rule
        earlier = apply_history_rule(np.array(prompt_ids + sampled_ids), ct.tokenizer)
        assert [*earlier.tolist(), *cont.ids] == full_ids
        kept = set(earlier.tolist())
        assert ("<|channel|>analysis" in ct.decode(prompt_ids + sampled_ids)) is thinking
        assert "<|channel|>analysis" not in ct.decode(earlier) and "<|return|>" not in ct.decode(earlier)
        assert kept <= set(prompt_ids + sampled_ids) | {ct.tokenizer.convert_tokens_to_ids("<|end|>")}


def test_harmony_turn_cut_by_max_tokens_is_closed_not_rewritten(harmony):
    ct = harmony
    _, _, new = shape("user_after_tools", True)
    cut = ct.encode("<|channel|>final<|message|>There are")[-1]
    cont = ct.continuation(new, TOOLS, None, previous_ended_with_eos=False, last_id=cut)
    assert cont.closed_truncated_turn and not cont.history_rule
    assert cont.text == "<|end|><|start|>user<|message|>Now delete them.<|end|><|start|>assistant"


def test_history_rule_keeps_every_other_id(harmony):
    """Two tool-loop turns and a final: both turns' analysis cut, the calls, results and final kept id for id."""
    ct = harmony
    ids = ct.encode("<|start|>user<|message|>go<|end|><|start|>assistant<|channel|>analysis<|message|>think 1<|end|>"
                    "<|start|>assistant to=functions.bash<|channel|>commentary json<|message|>{}<|call|>"
                    "<|start|>functions.bash to=assistant<|channel|>commentary<|message|>\"ok\"<|end|>"
                    "<|start|>assistant<|channel|>analysis<|message|>think 2<|end|>"
                    "<|start|>assistant<|channel|>final<|message|>done<|return|>")
    out = apply_history_rule(np.array(ids), ct.tokenizer)
    assert ct.decode(out) == ("<|start|>user<|message|>go<|end|>"
                              "<|start|>assistant to=functions.bash<|channel|>commentary json<|message|>{}<|call|>"
                              "<|start|>functions.bash to=assistant<|channel|>commentary<|message|>\"ok\"<|end|>"
                              "<|start|>assistant<|channel|>final<|message|>done<|end|>")
    assert apply_history_rule(np.array(ids[:-1]), ct.tokenizer) is None  # not a final answer: no rule


# openai-harmony's own renderer (vLLM's for gpt-oss), in the vLLM venv: a tool loop's prompt, and the prompt of the
# same conversation once a final answer and a user message follow it.
_HARMONY_RENDER = """
import json
from openai_harmony import *
enc = load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)
A = Role.ASSISTANT
loop = [Message.from_role_and_content(Role.USER, "go"),
        Message.from_role_and_content(A, "think 1").with_channel("analysis"),
        Message.from_role_and_content(A, "{}").with_channel("commentary").with_recipient("functions.bash")
            .with_content_type("json"),
        Message.from_author_and_content(Author.new(Role.TOOL, "functions.bash"), '"ok"').with_recipient("assistant")
            .with_channel("commentary")]
after = [Message.from_role_and_content(A, "think 2").with_channel("analysis"),
         Message.from_role_and_content(A, "done").with_channel("final"), Message.from_role_and_content(Role.USER, "next")]
render = lambda msgs: enc.render_conversation_for_completion(Conversation.from_messages(msgs), A)
print(json.dumps([render(loop), render(loop + after)]))
"""


@pytest.mark.vllm
def test_history_rule_is_openai_harmonys():
    """Sampled in harmony's own header form (as gpt-oss writes it), the rule on the ids gives exactly what
    openai-harmony renders for that history: the analysis dropped once a final answer exists, the final kept with
    `<|end|>`, the call with `<|call|>`."""
    import json
    import subprocess

    from tests.support.real_vllm import require_vllm_venv

    vocab = harmony_vocab_dir()
    ct = ChatTemplate.from_dir(vocab, family_template("gpt-oss"))
    run = subprocess.run([str(require_vllm_venv()), "-c", _HARMONY_RENDER], capture_output=True, text=True, check=True)
    loop_prompt, full = json.loads(run.stdout.strip().splitlines()[-1])
    sampled = ct.encode("<|channel|>analysis<|message|>think 2<|end|><|start|>assistant<|channel|>final<|message|>"
                        "done<|return|>")
    earlier = apply_history_rule(np.array(loop_prompt + sampled), ct.tokenizer)
    assert [*earlier.tolist(), *ct.encode("<|start|>user<|message|>next<|end|><|start|>assistant")] == full
    assert "think" in ct.decode(loop_prompt) and "think" not in ct.decode(full)
