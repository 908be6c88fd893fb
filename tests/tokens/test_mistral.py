"""Mistral's `[TOOL_CALLS]` section beyond what the corpus covers (tests/tokens/test_vllm_parser_agreement.py holds
the agreement with vLLM's `mistral` parser on Devstral's real template and the older JSON-list calls), and
Mistral-Small-3.2's tool-call ids on its real template (9 alphanumerics or it raises)."""

import pytest

from polar.canonical import ChatRequest, Message, TextPart, ToolCall
from polar.tokens.parsers import parse_turn
from polar.tokens.shaping import TemplateTraits, nine_char_id, shape
from polar.tokens.stream_parse import TurnStream
from polar.tokens.template import ChatTemplate
from tests.conftest import FAMILY_TEMPLATES, family_template
from tests.support.stand_in import END_TOKENS, stand_in_tokenizer
from tests.tokens.parser_corpus import TOOLS


def parse(text, finish_reason="stop"):
    return parse_turn(text, "mistral", think_open=False, finish_reason=finish_reason, tools=TOOLS)


def test_call_ids_as_mistral_small_writes_them():
    turn = parse('[TOOL_CALLS]get_weather[CALL_ID]call1abcd[ARGS]{"city": "Paris"}[TOOL_CALLS]list_dir[CALL_ID]'
                 "call2abcd[ARGS]{}</s>")
    assert [(c.name, c.arguments) for c in turn.tool_calls] == [("get_weather", '{"city": "Paris"}'), ("list_dir", "{}")]
    assert (turn.content, turn.malformed) == ("", [])
    assert [c.id for c in turn.tool_calls] == ["call1abcd", "call2abcd"]  # the model's own: its results must name them


def test_a_bad_section_stays_raw_whole_and_is_named():
    text = 'Sure.[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]nope[ARGS]{}'
    turn = parse(text)
    assert turn.tool_calls == [] and turn.content == text and "unknown function 'nope'" in turn.malformed[0]
    cut = parse('[TOOL_CALLS][{"name": "list_dir", "argu', finish_reason="length")
    assert cut.tool_calls == [] and "length limit" in cut.malformed[0]


def test_the_stream_hands_the_model_its_own_call_ids():
    stream = TurnStream("mistral", think_open=False, tools=TOOLS)
    text = '[TOOL_CALLS]get_weather[CALL_ID]a1b2c3d4e[ARGS]{"city": "Paris"}</s>'
    deltas = [d for piece in (text[:20], text[20:]) for d in stream.feed(piece)] + list(stream.finish("stop"))
    assert [d.id for d in deltas if getattr(d, "id", None)] == ["a1b2c3d4e"]


def request(*messages: Message) -> ChatRequest:
    return ChatRequest(model="m", messages=list(messages))


def harness_turn(call_id: str, result: str) -> list[Message]:
    return [Message(role="assistant", content=[], tool_calls=[ToolCall(id=call_id, name="list_dir", arguments="{}")]),
            Message(role="tool", tool_call_id=call_id, content=[TextPart(text=result)])]


@pytest.fixture(scope="module")
def mistral_small(tokenizer_dir):
    tok = stand_in_tokenizer(tokenizer_dir, "mistral")
    tok.eos_token = "</s>"  # the template writes eos_token after calls: Mistral's own
    text = family_template("mistral-small-3.2").read_text()
    return ChatTemplate(tok, text, eos_token_ids=[tok.convert_tokens_to_ids(t) for t in END_TOKENS["mistral"]],
                        name="mistral-small-3.2")


def test_only_mistral_small_takes_nine_alphanumeric_call_ids_alone():
    for label, stem in FAMILY_TEMPLATES.items():
        traits = TemplateTraits.of(family_template(label).read_text(), label)
        assert traits.nine_char_call_ids is (label == "mistral-small-3.2"), label
        assert traits.tool_role or label not in ("mistral-small-3.2",)


def test_harness_ids_map_to_nine_alphanumerics_the_same_way_every_call(mistral_small):
    """Shaped for the real template: a harness's ids (Anthropic's, OpenAI's) become 9 alphanumerics in the call and its
    result alike, the same on the next call (shaping call n+1 extends shaping call n); the model's own id is kept; the
    request the harness sent is untouched, so its ids come back to it as they were."""
    ct = mistral_small
    user = Message(role="user", content=[TextPart(text="list it")])
    first = request(user, *harness_turn("toolu_01AbCdEfGhIjKlMnOp", "a.txt"))
    later = request(*first.messages, *harness_turn("call_9f8e7d6c5b4a", "b.txt"), *harness_turn("k2J9x0QaZ", "c.txt"))
    shaped, notes = shape(later, ct.traits())
    shorter, _ = shape(first, ct.traits())
    assert shaped.messages[: len(shorter.messages)] == shorter.messages
    ids = [m.tool_calls[0].id if m.tool_calls else m.tool_call_id for m in shaped.messages[1:]]
    assert ids[0] == ids[1] == nine_char_id("toolu_01AbCdEfGhIjKlMnOp") and ids[2] == ids[3] != ids[0]
    assert ids[4] == ids[5] == "k2J9x0QaZ" and all(len(i) == 9 and i.isalnum() for i in ids)
    assert len(notes) == 4 and "9 alphanumerics" in notes[0]
    assert later.messages[1].tool_calls[0].id == "toolu_01AbCdEfGhIjKlMnOp"  # the caller's request as it was
    rendered = ct.render(shaped.messages, TOOLS)
    assert f"[CALL_ID]{ids[0]}[ARGS]" in rendered and f"[TOOL_RESULTS]{ids[0]}[TOOL_CONTENT]a.txt" in rendered
    with pytest.raises(Exception, match="alphanumeric strings with length 9"):
        ct.render(later.messages, TOOLS)


def test_a_tool_result_continues_the_models_own_call_id(mistral_small):
    """Token-faithful: the model wrote `[CALL_ID]ID`; polar hands the harness that id, its result comes back under it,
    and the continuation names it as the model did (equal to a full render)."""
    ct = mistral_small
    user = {"role": "user", "content": "list it"}
    prompt = ct.render([user], TOOLS)
    sample = "[TOOL_CALLS]list_dir[CALL_ID]Zx81kQ0pA[ARGS]{}</s>"
    turn = ct.parse(sample.removesuffix("</s>"), enable_thinking=None, finish_reason="stop", tools=TOOLS)
    call = turn.tool_calls[0]
    assert call.id == "Zx81kQ0pA"
    result = {"role": "tool", "tool_call_id": call.id, "content": "a.txt"}
    ids = ct.encode(sample)
    cont = ct.continuation([result], TOOLS, None, previous_ended_with_eos=ids[-1] == ct.end_of_turn_id,
                           last_id=ids[-1])
    assert cont.failure is None
    message = {"role": "assistant", "content": "", "tool_calls": [
        {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}]}
    assert ct.encode(prompt) + ids + cont.ids == ct.encode(ct.render([user, message, result], TOOLS))
