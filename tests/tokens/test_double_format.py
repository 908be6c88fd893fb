"""The scripted double answers the way the model behind each real template writes a turn.

What the double samples after a template's generation prompt, parsed as vLLM would (keeping the
template's newlines around the reasoning, as vLLM 0.32 does), taken without that glue as polar records
it, and rendered back by that template, must be exactly the sampled text: otherwise a test on a real
template would measure the double rather than polar.
"""

from __future__ import annotations

import json

import pytest

from polar.doubles.scripted_vllm import ModelFormat, Step
from polar.upstream.results import content_as_written
from tests.conftest import REAL_TEMPLATES

TOOLS = [{"type": "function", "function": {"name": "run", "description": "Run a command.", "parameters": {
    "type": "object", "properties": {"cmd": {"type": "string"}, "timeout": {"type": "integer"}}, "required": ["cmd"]}}}]
CONVERSATION = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Run the tests — s'il vous plaît."}]
STEPS = [
    Step(reasoning="Run them.", content="", tool_calls=[{"name": "run", "arguments": {"cmd": "pytest -q", "timeout": 60}}]),
    Step(reasoning="Two at once.", content="Checking both.", tool_calls=[
        {"name": "run", "arguments": {"cmd": "ls"}}, {"name": "run", "arguments": {"cmd": "pwd", "timeout": 5}}]),
    Step(reasoning="All good.", content="Tout va bien ✓"),
]
FAMILY = {"qwen3.5-4b": ("qwen3_xml", True), "qwen3-hybrid": ("qwen3", True), "qwen3-coder": ("qwen3_xml", False)}


@pytest.mark.parametrize("thinking", [True, False])
@pytest.mark.parametrize("step", range(len(STEPS)))
@pytest.mark.parametrize("name", REAL_TEMPLATES)
def test_sample_renders_back_exactly(load, name, step, thinking):
    ct = load(name)
    fmt = ModelFormat.for_template(ct.template_text)
    assert (fmt.family, fmt.knows_think) == FAMILY[name]
    prompt = ct.render(CONVERSATION, TOOLS, True, thinking)
    sample = fmt.completion(STEPS[step], prompt)
    reasoning, content, calls = fmt.parse(sample, prompt, TOOLS)
    content = content_as_written(content, reasoning is not None, bool(calls))
    reasoning = reasoning.strip("\n") if reasoning is not None else None
    message = {"role": "assistant", "content": content,
               "tool_calls": [{"id": f"c{i}", "type": "function", "function": c} for i, c in enumerate(calls)]}
    if reasoning is not None:
        message["reasoning_content"] = reasoning
    assert [json.loads(c["arguments"]) for c in calls] == [c["arguments"] for c in STEPS[step].tool_calls]
    assert (reasoning == STEPS[step].reasoning) is (thinking and name != "qwen3-coder")
    whole = ct.render([*CONVERSATION, message], TOOLS, False, thinking)
    assert whole == prompt + sample + ct.end_of_turn + "\n"


def test_template_switches_at_run_time(double_server, load):
    """POST /_double/template: prompts render with the new template and answers follow its family."""
    import httpx

    from tests.conftest import real_template

    _, url = double_server
    body = {"messages": CONVERSATION, "tools": TOOLS, "return_token_ids": True,
            "chat_template_kwargs": {"enable_thinking": True}}
    try:
        switched = httpx.post(f"{url}/_double/template", json={"chat_template": str(real_template("qwen3-hybrid"))})
        assert switched.json()["family"] == "qwen3" and switched.json()["knows_think"]
        httpx.post(f"{url}/_double/script", json={"steps": [STEPS[0].__dict__]}).raise_for_status()
        answer = httpx.post(f"{url}/v1/chat/completions", json=body).json()
        ct = load("qwen3-hybrid")
        assert answer["prompt_token_ids"] == ct.prompt_ids(CONVERSATION, TOOLS, True)
        sampled = ct.decode(answer["choices"][0]["token_ids"])
        assert sampled.startswith("<think>\nRun them.\n</think>\n\n<tool_call>\n{\"name\": \"run\", ")
        message = answer["choices"][0]["message"]
        assert message["reasoning"] == "\nRun them.\n" and message["tool_calls"][0]["function"]["name"] == "run"
        bad = httpx.post(f"{url}/_double/template", json={"chat_template": "/nonexistent/template.jinja"})
        assert bad.status_code == 400 and "bad template" in bad.json()["error"]["message"]
    finally:
        httpx.post(f"{url}/_double/template", json={"chat_template": None}).raise_for_status()
    assert httpx.get(f"{url}/_double/template").json()["family"] == "qwen3_xml"  # the tokenizer's own again


# The other families polar parses in token-faithful mode, on their real templates with DeepSeek's real vocabulary and
# stand-ins for the rest (tests/support/stand_in.py). GLM is left out: token-faithful mode refuses it (no end-of-turn token after an answer).
FAMILY_LABELS = {"llama-3.3": "llama3_json", "deepseek-v3.1": "deepseek_v31", "kimi-k2": "kimi_k2",
                 "minimax-m2": "minimax_m2", "deepseek-v3.2": "deepseek_dsml", "deepseek-v4": "deepseek_v4",
                 "kimi-k2-instruct": "kimi_k2_instruct", "kimi-k2-thinking": "kimi_k2_thinking"}
# Kimi-K2-Thinking's model opens its reasoning itself, thinking on or off (its template has no switch).
WRITES_OWN_THINK = {"kimi-k2-thinking"}
# Kimi-K2-Thinking writes `<think></think>` for a turn up to the last answer: an answer's reasoning never renders back.
DROPS_ANSWER_REASONING = {"kimi-k2-thinking"}
# Llama-3's answer is text or calls, one call a turn (its template refuses parallel calls).
LLAMA_STEPS = [Step(content="", tool_calls=STEPS[0].tool_calls), STEPS[2]]
# DeepSeek-V3.1 writes `<think></think>` for every earlier turn: its sampled reasoning never renders back.
DROPS_REASONING = {"deepseek-v3.1"}
# DeepSeek-V3.2 writes an earlier turn without thinking as `</think>` where its generation prompt wrote `<think></think>`.
CLOSES_THINK_ALONE = {"deepseek-v3.2"}


@pytest.fixture(scope="module")
def family_format(tokenizer_dir):
    from polar.tokens.template import ChatTemplate
    from tests.conftest import family_template
    from tests.support.stand_in import END_TOKENS, family_tokenizer

    made: dict[str, tuple[ChatTemplate, ModelFormat]] = {}

    def get(label: str) -> tuple[ChatTemplate, ModelFormat]:
        if label not in made:
            text, family = family_template(label).read_text(), parser_of(FAMILY_LABELS[label])
            tok = family_tokenizer(tokenizer_dir, family)
            ct = ChatTemplate(tok, text, eos_token_ids=[tok.convert_tokens_to_ids(END_TOKENS[family][0])], name=label)
            made[label] = ct, ModelFormat.for_template(text)
        return made[label]

    return get


FAMILY_CASES = [(label, step, thinking) for label in FAMILY_LABELS for thinking in (True, False)
                for step in (LLAMA_STEPS if label == "llama-3.3" else STEPS)]


@pytest.mark.parametrize("label,step,thinking", FAMILY_CASES, ids=lambda v: v if isinstance(v, str) else None)
def test_family_sample_parses_and_renders_back(family_format, label, step, thinking):
    """What the double samples, read by polar's family parser, is the scripted answer; the real template renders
    that answer back as exactly the sample and its end-of-turn token."""
    from polar.tokens.parsers import parse_turn

    ct, fmt = family_format(label)
    assert fmt.family == FAMILY_LABELS[label] and fmt.end_of_turn == ct.end_of_turn
    conversation = [{"role": "system", "content": "Be brief."}, *CONVERSATION[1:]]
    prompt = ct.render(conversation, TOOLS, True, thinking)
    sample = fmt.completion(step, prompt)
    think_open = fmt.reasoning_mode(prompt) == "open"
    turn = parse_turn(sample + fmt.end_of_turn, parser_of(fmt.family), think_open=think_open, finish_reason="stop", tools=TOOLS)
    assert not turn.malformed
    assert [(c.name, json.loads(c.arguments)) for c in turn.tool_calls] == [
        (c["name"], c["arguments"]) for c in step.tool_calls]
    assert turn.content == step.content
    assert turn.reasoning == (step.reasoning if think_open or label in WRITES_OWN_THINK else None)
    assert think_open is (label == "minimax-m2" or (thinking and label.startswith("deepseek")))  # MiniMax always thinks
    assert fmt.parse(sample, prompt, TOOLS)[1:] == (turn.content, [
        {"name": c.name, "arguments": c.arguments} for c in turn.tool_calls])  # the double's chat endpoint reads it so
    message = {"role": "assistant", "content": turn.content, "tool_calls": [
        {"id": f"c{i}", "type": "function", "function": {"name": c.name, "arguments": json.loads(c.arguments)}}
        for i, c in enumerate(turn.tool_calls)]}
    if turn.reasoning is not None:
        message["reasoning_content"] = turn.reasoning
    whole = ct.render([*conversation, message], TOOLS, False, thinking)
    if think_open and label in DROPS_REASONING:
        prompt, sample = prompt.removesuffix(fmt_think(fmt)), sample[sample.index("</think>") :]
        prompt += "<think>"
    if not think_open and label in CLOSES_THINK_ALONE:
        prompt = prompt.removesuffix("<think></think>") + "</think>"
    if label in DROPS_ANSWER_REASONING and not step.tool_calls:
        sample = "<think></think>" + sample.removeprefix(f"<think>{step.reasoning}</think>")
    assert whole.startswith(prompt + sample + fmt.end_of_turn), (whole[len(prompt) :], sample)
    ids = ct.encode(sample + fmt.end_of_turn)
    assert ids[-1] == ct.end_of_turn_id and ct.decode(ids) == sample + fmt.end_of_turn


def fmt_think(fmt: ModelFormat) -> str:
    from polar.doubles.family_writers import WRITERS

    return WRITERS[fmt.family].think_open


def parser_of(writer: str) -> str:
    from polar.doubles.family_writers import WRITERS

    return WRITERS[writer].parser or writer


@pytest.mark.parametrize("label", ["kimi-k2", "kimi-k2-instruct", "kimi-k2-thinking"])
def test_kimi_numbers_calls_as_its_template_does(family_format, label):
    """After a turn of one call and its result, the double's next calls are `functions.run:1` and `:2` on
    Kimi-K2-Instruct and -Thinking (their templates count every call of the conversation, as the model goes on
    doing), `:0` and `:1` on `moonshotai-Kimi-K2` (a turn's own index); the real template renders that conversation
    back as exactly the prompt, the sample and its end of turn."""
    ct, fmt = family_format(label)
    first = {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c0", "type": "function", "function": {"name": "run", "arguments": {"cmd": "pytest -q"}}}]}
    if label in WRITES_OWN_THINK:
        first["reasoning_content"] = "Run them."
    conversation = [*CONVERSATION, first, {"role": "tool", "tool_call_id": "functions.run:0", "content": "ok"}]
    prompt = ct.render(conversation, TOOLS, True, True)
    sample = fmt.completion(STEPS[1], prompt)
    numbers = (1, 2) if label != "kimi-k2" else (0, 1)
    assert [f"functions.run:{n}<|tool_call_argument_begin|>" in sample for n in numbers] == [True, True], sample
    assert sample.startswith("<think>Two at once.</think>Checking both.") is (label in WRITES_OWN_THINK)
    reasoning, content, calls = fmt.parse(sample, prompt, TOOLS)
    message = {"role": "assistant", "content": content, "tool_calls": [
        {"id": f"c{i}", "type": "function", "function": {"name": c["name"], "arguments": json.loads(c["arguments"])}}
        for i, c in enumerate(calls, 1)]}
    if reasoning is not None:
        message["reasoning_content"] = reasoning
    whole = ct.render([*conversation, message], TOOLS, False, True)
    assert whole == prompt + sample + fmt.end_of_turn


def test_double_answers_a_family_chat_call(tokenizer_dir, tmp_path):
    """The double's chat endpoint on Kimi-K2's real template: the prompt and the sample in Kimi's own tokens, the
    answer read by polar's Kimi parser; a streamed chat call is refused by name (deltas.py cuts Qwen's only)."""
    from starlette.testclient import TestClient

    from polar.doubles.scripted_vllm import ScriptedVLLM
    from tests.conftest import family_template
    from tests.support.stand_in import stand_in_dir

    vocab = stand_in_dir(tokenizer_dir, tmp_path / "vocab", "kimi_k2")
    double = ScriptedVLLM(vocab, chat_template=family_template("kimi-k2"))
    double.script = type(double.script).from_json({"steps": [STEPS[1].__dict__]})
    body = {"messages": CONVERSATION, "tools": TOOLS, "return_token_ids": True}
    with TestClient(double.app) as client:
        answer = client.post("/v1/chat/completions", json=body).json()
        refused = client.post("/v1/chat/completions", json={**body, "stream": True})
    choice = answer["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] == "Checking both."
    assert [json.loads(c["function"]["arguments"]) for c in choice["message"]["tool_calls"]] == [
        c["arguments"] for c in STEPS[1].tool_calls]
    assert choice["token_ids"][-1] == double.tokenizer.convert_tokens_to_ids("<|im_end|>") == double.eos_id
    assert double.tokenizer.decode(choice["token_ids"]).startswith("Checking both.<|tool_calls_section_begin|>")
    assert refused.status_code == 400 and "kimi_k2 answers stream through the token-in endpoints" in refused.text


def test_vocabulary_switches_with_the_template(tokenizer_dir, tmp_path):
    """POST /_double/template with a "tokenizer": the double samples in that vocabulary (MiniMax-M2's stand-in) on
    that family's real template; a template the new vocabulary cannot end leaves the old one in place; null returns
    to the double's own vocabulary and template."""
    from starlette.testclient import TestClient

    from polar.doubles.scripted_vllm import ScriptedVLLM
    from tests.conftest import family_template
    from tests.support.stand_in import stand_in_dir

    vocab = stand_in_dir(tokenizer_dir, tmp_path / "vocab", "minimax_m2")
    double = ScriptedVLLM(tokenizer_dir)
    own_size = double.vocab_size
    body = {"messages": CONVERSATION, "tools": TOOLS, "return_token_ids": True}
    with TestClient(double.app) as client:
        switched = client.post("/_double/template", json={"chat_template": str(family_template("minimax-m2")),
                                                          "tokenizer": str(vocab)}).json()
        assert switched["family"] == "minimax_m2" and switched["tokenizer"] == str(vocab)
        client.post("/_double/script", json={"steps": [STEPS[0].__dict__]}).raise_for_status()
        answer = client.post("/v1/chat/completions", json=body).json()
        ids = answer["choices"][0]["token_ids"]
        assert ids[-1] == double.eos_id == double.tokenizer.convert_tokens_to_ids("[e~[") >= own_size
        assert "<minimax:tool_call>" in double.tokenizer.decode(ids)
        assert answer["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "run"
        # Llama's turns end with <|eot_id|>, which Qwen's own vocabulary lacks.
        bad = client.post("/_double/template", json={"chat_template": str(family_template("llama-3.3")),
                                                     "tokenizer": str(tokenizer_dir)})
        assert bad.status_code == 400 and "<|eot_id|>" in bad.json()["error"]["message"]
        assert client.get("/_double/template").json() == switched  # vocabulary and template as they were
        home = client.post("/_double/template", json={"chat_template": None, "tokenizer": None}).json()
    assert home["family"] == "qwen3_xml" and home["tokenizer"] == str(tokenizer_dir) and double.vocab_size == own_size
