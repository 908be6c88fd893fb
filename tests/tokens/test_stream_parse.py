"""The streamed parse of a sampled turn adds up to the non-streaming parser's answer, whatever the split;
it holds back only what is still ambiguous; real templates streamed token by token; incremental decoding."""

from __future__ import annotations

import json
import random
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from polar.canonical import ReasoningDelta, TextDelta, ToolCallDelta
from polar.tokens import parse_turn
from polar.tokens.stream_parse import IncrementalDecoder, TurnStream, stop_cut
from tests.conftest import REAL_TEMPLATES
from tests.tokens.test_parsers import CASES, TOOLS, assistant_message, sampled_text


def stream(pieces, family, *, think_open=False, finish="stop", stops=(), full_text=None, tools=TOOLS):
    ts = TurnStream(family, think_open=think_open, tools=tools, stop_strings=stops)
    deltas = [d for p in pieces for d in ts.feed(p)]
    return ts, deltas + ts.finish(finish, full_text)


def assert_equivalent(ts, deltas, text, family, *, think_open, finish, stops):
    """The deltas say what parse_turn says of the text cut at its first stop string; `result` is that parse."""
    want = parse_turn(text[: stop_cut(text, stops)], family, think_open=think_open, finish_reason=finish, tools=TOOLS)
    kinds = [type(d) for d in deltas]
    n_reasoning = kinds.count(ReasoningDelta)
    assert kinds[:n_reasoning] == [ReasoningDelta] * n_reasoning  # reasoning first
    assert all(d.text for d in deltas if not isinstance(d, ToolCallDelta))  # no empty deltas
    assert "".join(d.text for d in deltas if isinstance(d, ReasoningDelta)) == (want.reasoning or "")
    assert "".join(d.text for d in deltas if isinstance(d, TextDelta)) == want.content
    calls = [d for d in deltas if isinstance(d, ToolCallDelta)]
    assert [(d.index, d.name, d.arguments) for d in calls] == [(i, c.name, c.arguments)
                                                              for i, c in enumerate(want.tool_calls)]
    assert all(d.id.startswith("call_") for d in calls) and len({d.id for d in calls}) == len(calls)
    got = ts.result
    assert (got.content, got.reasoning, got.truncated, got.malformed) == (
        want.content, want.reasoning, want.truncated, want.malformed)
    assert [(c.id, c.name, c.arguments) for c in got.tool_calls] == [(d.id, d.name, d.arguments) for d in calls]


# -- the property: any turn, any split ------------------------------------------------------------------------

STOPS = ["STOP", "##", "\n\n\n", "é!", "</tool_call>", "<think>x", "S"]
TEXT = st.text(st.sampled_from("ab é日🙂\n\t\u3000\u2028\x85<>/=\"{}:,"), max_size=10)
MARKUP = st.sampled_from([
    "<think>", "</think>", "\n", "\n\n", " ", " \n ", "\t", "\u3000", "<tool_call>", "</tool_call>", "<|im_end|>",
    "<|endoftext|>", "<|im_", "<tool_", "</tool_call", "<thi", "</think", "<function=bash>", "</function>",
    "<parameter=cmd>", "</parameter>", *STOPS])
NAMES = st.sampled_from(["bash", "edit", "rm_rf"])
ARGS = st.dictionaries(st.sampled_from(["cmd", "path", "count", "x"]),
                       st.integers(-5, 5) | st.text(st.sampled_from("ab é\n<>"), max_size=5), max_size=3)


@st.composite
def json_call(draw):
    name, args = draw(NAMES), draw(ARGS)
    sep = draw(st.sampled_from([(",", ":"), (", ", ": ")]))
    body = draw(st.sampled_from([
        json.dumps({"name": name, "arguments": args}, separators=sep, ensure_ascii=draw(st.booleans())),
        json.dumps({"name": name, "arguments": json.dumps(args)}),  # arguments as a JSON string
        json.dumps({"name": name}),  # no arguments
        '{"name": "%s", "arguments": {' % name,  # bad JSON
        '["bash"]',
    ]))
    return f"<tool_call>\n{body}\n</tool_call>"


@st.composite
def xml_call(draw):
    params = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in draw(ARGS).items())
    body = draw(st.sampled_from([f"<function={draw(NAMES)}>\n{params}</function>", "bash ls",
                                 f"<function=bash>\n{params}", "<function=bash>\nstray\n</function>"]))
    return f"<tool_call>\n{body}\n</tool_call>"


@st.composite
def broken_call(draw):
    call = draw(json_call() | xml_call())
    cut = draw(st.integers(1, len(call) - 1))
    return call[:cut]  # never closed, or a new <tool_call> before the close when another piece follows


@st.composite
def good_call(draw):
    name, args = draw(st.sampled_from(["bash", "edit"])), draw(ARGS)
    params = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in args.items())
    body = draw(st.sampled_from([json.dumps({"name": name, "arguments": args}),
                                 f"<function={name}>\n{params}</function>"]))
    return draw(st.sampled_from(["", "\n", " \n\n"])) + f"<tool_call>\n{body}\n</tool_call>"


# well-formed calls of both families (each family reads the other's as malformed), broken ones, and text
PIECE = st.one_of(TEXT, MARKUP, good_call(), good_call(), json_call(), xml_call(), broken_call())


@st.composite
def splits(draw, text):
    """Pieces of `text` cut at random points: single characters, empty pieces, large chunks."""
    if draw(st.booleans()):
        return list(text)
    cuts = sorted(draw(st.lists(st.integers(0, len(text)), max_size=12)))
    bounds = [0, *cuts, len(text)]
    return [text[a:b] for a, b in zip(bounds, bounds[1:])]


@pytest.mark.parametrize("family", ["qwen3", "qwen3_xml", "plain"])
@settings(max_examples=400, deadline=None)
@given(data=st.data(), parts=st.lists(PIECE, max_size=14), think_open=st.booleans(),
       finish=st.sampled_from(["stop", "length"]), stops=st.lists(st.sampled_from(STOPS), max_size=2))
def test_the_stream_adds_up_to_parse_turn(family, data, parts, think_open, finish, stops):
    text = "".join(parts)
    pieces = data.draw(splits(text))
    ts, deltas = stream(pieces, family, think_open=think_open, finish=finish, stops=stops)
    assert_equivalent(ts, deltas, text, family, think_open=think_open, finish=finish, stops=stops)


# -- examples -------------------------------------------------------------------------------------------------

XML_CALL = "<tool_call>\n<function=bash>\n<parameter=cmd>\nls\n</parameter>\n</function>\n</tool_call>"


def test_text_after_a_call_follows_it_in_the_stream():
    """The one divergence from parse_turn: its content comes before the calls; the stream cannot wait."""
    text = f"Before.\n\n{XML_CALL}\nBetween.\n{XML_CALL}\nAfter.<|im_end|>"
    _, deltas = stream(list(text), "qwen3_xml")
    seq = [""]
    for d in deltas:
        if isinstance(d, TextDelta):
            seq[-1] += d.text
        else:
            seq += [d.index, ""]
    assert seq == ["Before.", 0, "\n\nBetween.", 1, "\n\nAfter."]
    assert parse_turn(text, "qwen3_xml", think_open=False, finish_reason="stop", tools=TOOLS).content == (
        "Before.\n\nBetween.\n\nAfter.")


def test_plain_answer_and_reasoning_flow_piece_by_piece():
    ts = TurnStream("qwen3_xml", think_open=True, tools=TOOLS)
    assert ts.feed("Let") == [ReasoningDelta("Let")]
    assert ts.feed(" me\n") == [ReasoningDelta(" me")]  # the newline waits: "</think>" would strip it
    assert ts.feed("see") == [ReasoningDelta("\nsee")]
    assert ts.feed("\n</") == [] and ts.feed("think>\n\n") == []
    assert ts.feed("The") == [TextDelta("The")]
    assert ts.feed(" answer ") == [TextDelta(" answer")]  # trailing whitespace: a call would drop it
    assert ts.feed("is <") == [TextDelta(" is")]  # "<" may open <tool_call>
    assert ts.feed("b>") == [TextDelta(" <b>")]
    assert ts.feed("<|im_end|>") == [] and ts.finish("stop") == []
    assert (ts.result.reasoning, ts.result.content) == ("Let me\nsee", "The answer is <b>")


def test_an_open_call_block_is_held_until_it_closes():
    ts = TurnStream("qwen3", think_open=False, tools=TOOLS)
    assert ts.feed("Ok.\n<tool_call>\n") == [TextDelta("Ok.")]
    assert ts.feed('{"name": "bash", "arguments": {"cmd": "ls"}}\n</tool_call') == []
    [call] = ts.feed(">\n")
    assert (call.index, call.name, call.arguments) == (0, "bash", '{"cmd": "ls"}')
    assert ts.feed("<tool_call>\n{") == [] and ts.finish("length") == [TextDelta("\n\n<tool_call>\n{")]
    assert ts.result.truncated and "unfinished tool call" in ts.result.malformed[0]


def test_stop_strings_and_end_of_turn_text():
    ts, deltas = stream(["Hello wor", "ld ST", "OP and more"], "plain", stops=["STOP"])
    assert deltas == [TextDelta("Hello wor"), TextDelta("ld ")] and ts.result.content == "Hello world "
    # the first stop string to be complete wins, as in vLLM (not the one that starts first)
    assert stop_cut("abcd", ["abcd", "c"]) == 2 and stop_cut("xabc", ["bc", "abc"]) == 1
    ts, deltas = stream(["a<|im_end|>", "<|im_end|>"], "plain")  # only the last one is dropped
    assert ts.result.content == "a<|im_end|>" == "".join(d.text for d in deltas)


def test_full_text_at_finish():
    ts, deltas = stream(["Hi th"], "plain", full_text="Hi there")  # the rest is fed first
    assert "".join(d.text for d in deltas) == "Hi there" and not ts.diverged
    ts, deltas = stream(["Hi th"], "plain", full_text="Ho there")  # disagrees: `result` is the truth
    assert ts.diverged and "".join(d.text for d in deltas) == "Hi th" and ts.result.content == "Ho there"


def test_feed_cost_is_linear():
    """A 20k-token reasoning and a 20k-token call block fed token by token cost about the same per token."""
    def per_token(text, n):
        pieces = [text[i:i + n] for i in range(0, len(text), n)]
        ts = TurnStream("qwen3_xml", think_open=True, tools=TOOLS)
        t0 = time.perf_counter()
        for p in pieces:
            ts.feed(p)
        ts.finish("stop")
        return (time.perf_counter() - t0) / len(pieces)

    rng = random.Random(1)
    words = ["the", " plan", "\n", " is", " <b>", "\n\n", " é", " 日本", "<", " x"]
    reasoning = "".join(rng.choice(words) for _ in range(20000))
    block = "</think>\n\n<tool_call>\n<function=bash>\n<parameter=cmd>\n" + reasoning + "\n</parameter>\n</function>\n"
    short, long = per_token(reasoning[:8000], 3), per_token(reasoning * 4, 3)
    assert long < 5 * short + 20e-6, (short, long)  # no growth with length (generous: 2 shared cores)
    assert per_token(block * 2, 3) < 5 * short + 20e-6


# -- real templates, real tokenizer ---------------------------------------------------------------------------


@pytest.mark.parametrize("thinking", [True, False])
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("template", REAL_TEMPLATES)
def test_real_turns_streamed_token_by_token(load, tokenizer, template, case, thinking):
    """A turn as the real template renders it, sampled id by id and decoded incrementally."""
    ct = load(template)
    reasoning, content, calls = CASES[case]
    text = sampled_text(ct, assistant_message(reasoning if thinking else "", content, calls), thinking)
    ids = tokenizer.encode(text, add_special_tokens=False)
    body = ids[:-1] if ids[-1] in ct.eos_token_ids else ids  # as TokenFaithful._result does
    think_open = ct.generation_prompt_opens_think(thinking)
    decoder = IncrementalDecoder(tokenizer)
    pieces = [decoder.step(i) for i in body] + [decoder.finish()]
    full = ct.decode(body)
    assert "".join(pieces) == full
    ts, deltas = stream(pieces, ct.family, think_open=think_open, full_text=full)
    assert not ts.diverged
    assert_equivalent(ts, deltas, full, ct.family, think_open=think_open, finish="stop", stops=())
    assert (ts.result.content, [c.name for c in ts.result.tool_calls]) == (content, [n for n, _ in calls])


def test_incremental_decoding_matches_the_full_decode(tokenizer):
    """DecodeStream holds back text ending in U+FFFD (a split or invalid UTF-8 sequence, or U+FFFD itself);
    at the end of a sample nothing releases it: IncrementalDecoder.finish does. Nothing else ever differs."""
    from tokenizers.decoders import DecodeStream

    raw = tokenizer._tokenizer
    vocab = raw.get_vocab(with_added_tokens=True)
    byte_tokens = [i for t, i in vocab.items() if len(t) == 1]  # the 256 byte-level tokens
    added = [i for t, i in vocab.items() if t.startswith("<") and t.endswith(">") and len(t) > 3]
    rng = random.Random(7)
    text_chars = "aé日🙂\ufffd <>\n\u0300\U0010ffff"
    held_back = 0
    for trial in range(3000):
        if trial % 3 == 0:
            ids = [rng.choice(byte_tokens + added[:20]) for _ in range(rng.randint(1, 20))]
        elif trial % 3 == 1:
            ids = [rng.randrange(0, len(vocab)) for _ in range(rng.randint(1, 20))]
        else:
            ids = raw.encode("".join(rng.choice(text_chars) for _ in range(12)), add_special_tokens=False).ids
            ids = ids[: rng.randint(1, len(ids))]  # cut anywhere, inside a character too
        full = raw.decode(ids, skip_special_tokens=False)
        ds = DecodeStream(skip_special_tokens=False)
        streamed = "".join(s for i in ids if (s := ds.step(raw, i)) is not None)
        if streamed != full:
            assert full.startswith(streamed) and full.endswith("\ufffd"), (ids, full, streamed)
            held_back += 1
        decoder = IncrementalDecoder(tokenizer)
        assert "".join(decoder.step(i) for i in ids) + decoder.finish() == full
    assert held_back > 100  # the case is common with random ids: the fallback matters


def test_incremental_decoder_survives_a_failing_stream(tokenizer):
    """Should DecodeStream ever raise ("invalid prefix"), the rest of the sample comes whole from finish()."""

    class Failing:
        def step(self, tok, i):
            raise Exception("Invalid prefix encountered")

    ids = tokenizer.encode("Ça marche 🙂 bien", add_special_tokens=False)
    decoder = IncrementalDecoder(tokenizer)
    first = decoder.step(ids[:2])
    decoder._stream = Failing()
    assert decoder.step(ids[2:]) == "" and first + decoder.finish() == tokenizer.decode(ids)
