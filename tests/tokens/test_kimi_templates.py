"""Kimi-K2-Instruct and Kimi-K2-Thinking, llama.cpp's copies of Moonshot's own templates, token-faithful.

Both keep a queue of the tool-call ids they wrote (`.append`, `.pop(0)`) and name each tool result after its call,
`functions.NAME:IDX`, IDX counting the conversation's calls. transformers' renderer (vLLM's chat endpoint's) refuses
the `.append`; polar renders them in jinja2's sandbox that lets a template change its own lists
(polar/tokens/sandbox.py). The oracle here is jinja2 itself on the real template, set up in this file as llama.cpp's
users and transformers' docs set it up (trim_blocks, lstrip_blocks, a non-ASCII `tojson`), independently of polar.

Kimi-K2-Thinking's history rule: every assistant turn up to the last one that calls no tool renders its reasoning
as `<think></think>` (dropped); turns after it (the running tool loop) keep `<think>R</think>`. Its generation
prompt opens no `<think>`: the model writes `<think>R</think>` itself. Token-faithful prompts keep what the model
sampled, so once a user message follows an answer they differ from a re-render by exactly the dropped reasoning.

Vocabulary: a stand-in (Qwen3.5's plus Kimi's special tokens; no registry package ships Kimi's); templates real.
"""

from __future__ import annotations

import json

import jinja2
import jinja2.ext
import pytest
from jinja2.sandbox import SandboxedEnvironment

from polar.tokens.template import ChatTemplate
from tests.conftest import family_template
from tests.support.stand_in import END_TOKENS, stand_in_tokenizer
from tests.tokens.test_template import TOOLS, call, tool

LABELS = ["kimi-k2-instruct", "kimi-k2-thinking"]
R1, R2, R3, R4 = "I should list them first.", "Two files: read both.", "Both read; answer.", "Delete, then check."
USER1 = {"role": "user", "content": "List the files, then read them — «données» 日本."}
USER2 = {"role": "user", "content": "Now delete them."}


def oracle(label: str, messages: list[dict], tools=TOOLS, add_generation_prompt=True) -> str:
    """jinja2 on the real template: what llama.cpp's renderer accepts (the sandbox lets the template change lists)."""
    env = SandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = lambda value: json.dumps(value, ensure_ascii=False)
    plain = json.loads(json.dumps(messages))  # the template's own copy, arguments as objects as vLLM hands them
    for m in plain:
        for c in m.get("tool_calls", []):
            c["function"]["arguments"] = json.loads(c["function"]["arguments"])
    return env.from_string(family_template(label).read_text()).render(
        messages=plain, tools=tools, add_generation_prompt=add_generation_prompt)


def turns() -> list[tuple[list[dict], dict, list[dict]]]:
    """A session: (messages before each sampled turn, the turn, the messages the harness sends after it)."""
    a1 = {"role": "assistant", "content": "", "reasoning_content": R1, "tool_calls": [call("c1", "bash", {"cmd": "ls"})]}
    a2 = {"role": "assistant", "content": "Reading both.", "reasoning_content": R2,
          "tool_calls": [call("c2", "read_file", {"path": "a.txt"}), call("c3", "read_file", {"path": "日本.txt"})]}
    a3 = {"role": "assistant", "content": "a.txt holds alpha, 日本.txt holds ✓.", "reasoning_content": R3}
    a4 = {"role": "assistant", "content": "", "reasoning_content": R4, "tool_calls": [call("c4", "bash", {"cmd": "rm *"})]}
    new = [[tool("c1", "a.txt\n日本.txt")], [tool("c2", "alpha"), tool("c3", "✓")], [USER2], [tool("c4", "")]]
    out, before = [], [USER1]
    for turn, after in zip([a1, a2, a3, a4], new, strict=True):
        out.append((before, turn, after))
        before = [*before, turn, *after]
    return out


@pytest.fixture(scope="module")
def kimi(tokenizer_dir):
    tok = stand_in_tokenizer(tokenizer_dir, "kimi_k2")
    ends = [tok.convert_tokens_to_ids(t) for t in END_TOKENS["kimi_k2"]]
    return {label: ChatTemplate(tok, family_template(label).read_text(), eos_token_ids=ends, name=label)
            for label in LABELS}


def sampled_text(label: str, before: list[dict], turn: dict) -> str:
    """What the model writes for `turn`: the template's own rendering of it in the running tool loop (Thinking:
    `<think>R</think>` first), up to and with `<|im_end|>`."""
    if label == "kimi-k2-thinking" and not turn.get("tool_calls"):  # an answer renders in history only: R dropped
        return f"<think>{turn['reasoning_content']}</think>{turn['content']}<|im_end|>"
    prompt = oracle(label, before)
    whole = oracle(label, [*before, turn], add_generation_prompt=False)
    assert whole.startswith(prompt)
    return whole[len(prompt):]


@pytest.mark.parametrize("label", LABELS)
def test_polar_renders_the_real_template_as_jinja2_does(kimi, label):
    ct = kimi[label]
    before, turn, after = turns()[-1]
    messages = [*before, turn, *after]
    assert ct.render(messages, TOOLS) == oracle(label, messages)
    assert "append" in ct.vllm_refusal  # vLLM's renderer refused it: polar rendered it in jinja2's sandbox
    assert "## Return of functions.read_file:2\n✓" in ct.render(messages, TOOLS)  # named by the conversation's count


@pytest.mark.parametrize("label", LABELS)
def test_a_token_faithful_session_is_what_the_template_renders(kimi, label):
    """Each prompt is the previous prompt + the sampled ids + the continuation, and equals jinja2's render of the
    conversation so far; on Thinking once a user message follows an answer, except for the reasoning that render
    drops (the history rule), which the sampled ids keep."""
    ct = kimi[label]
    session = turns()
    ids = ct.encode(oracle(label, session[0][0]))
    thinking = label == "kimi-k2-thinking"
    calls_before = 0
    for before, turn, after in session:
        sample = sampled_text(label, before, turn)
        parsed = ct.parse(sample, enable_thinking=None, finish_reason="stop", tools=TOOLS)
        assert [c.name for c in parsed.tool_calls] == [c["function"]["name"] for c in turn.get("tool_calls", [])]
        assert parsed.reasoning == (turn["reasoning_content"] if thinking else None)
        sampled = ct.encode(sample)
        assert sampled[-1] in ct.eos_token_ids
        names = [c["function"]["name"] for c in turn.get("tool_calls", [])]
        cont = ct.continuation(after, TOOLS, None, previous_ended_with_eos=True, last_id=sampled[-1],
                               previous_calls=names, calls_before=calls_before)
        assert cont.failure is None and "polar-probe" not in cont.text, cont.failure or cont.text
        ids = ids + sampled + cont.ids
        calls_before += len(names)
        full = oracle(label, [*before, turn, *after])
        faithful = ct.decode(ids)
        if thinking and any(m["role"] == "user" for m in after + before[1:]):
            for r in (R1, R2, R3):  # the turns up to the answer: their reasoning as sampled, `<think></think>` re-rendered
                faithful = faithful.replace(f"<think>{r}</think>", "<think></think>")
        assert faithful == full


@pytest.mark.parametrize("label", LABELS)
def test_kimi_templates_agree_with_moonshotai_kimi_k2_where_they_should(kimi, label):
    """A system prompt, a user message and a turn making two calls render alike in Moonshot's three templates (Thinking
    with its empty reasoning block); they part at the tool results: moonshotai-Kimi-K2 names a result by the
    harness's tool_call_id, the others by `functions.NAME:IDX`, the id the model wrote (IDX counting calls)."""
    system = {"role": "system", "content": "You are a careful coding agent."}
    turn = {"role": "assistant", "content": "Reading both.",
            "tool_calls": [call("c1", "read_file", {"path": "a.txt"}), call("c2", "bash", {"cmd": "wc -l"})]}
    messages = [system, USER1, turn]
    ours = kimi[label].render(messages, TOOLS, add_generation_prompt=False)
    moonshot = ChatTemplate(kimi[label].tokenizer, family_template("kimi-k2").read_text())
    theirs = moonshot.render(messages, TOOLS, add_generation_prompt=False)
    if label == "kimi-k2-thinking":
        ours = ours.replace("<|im_middle|><think></think>", "<|im_middle|>")
    assert ours == theirs
    assert kimi[label].generation_prompt() == moonshot.generation_prompt() == "<|im_assistant|>assistant<|im_middle|>"
    results = [tool("c1", "alpha"), tool("c2", "3")]
    assert "## Return of functions.bash:1\n3" in kimi[label].render([*messages, *results], TOOLS)
    assert "## Return of c2\\n3" in moonshot.render([*messages, *results], TOOLS)
