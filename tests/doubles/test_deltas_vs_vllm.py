"""The double's streamed deltas against vLLM's own streaming parsers, token for token, and its whole
answers against vLLM's whole-answer parse of the same text.

vLLM's parsers (the qwen3 reasoning parser with hermes for JSON calls, or with the qwen3 XML engine)
run in the vLLM venv over the very token ids the double streams (tests/support/vllm_parse.py), with
the same prompt and tools, one token per step as the engine hands them over: each token's delta
(reasoning, content, tool-call header or argument piece, or nothing) must be the double's. No server
is started; only the vLLM venv is needed (marked vllm: skipped without it unless POLAR_REQUIRE_VLLM).
"""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.conftest import REPO, real_template
from tests.support.real_vllm import TOOLS, require_vllm_venv

pytestmark = pytest.mark.vllm

TEMPLATES = ["own", "qwen3.5-4b", "qwen3-hybrid", "qwen3-coder"]  # the ones polar serves vLLM with
STEPS = [
    {"reasoning": "Let me look.", "content": "Hello there.",
     "tool_calls": [{"name": "read_file", "arguments": {"path": "README.md", "limit": 20}}]},
    {"reasoning": "Hm.", "tool_calls": [{"name": "read_file", "arguments": {"limit": 3, "path": "a b\nc.md"}},
                                       {"name": "read_file", "arguments": {"path": "x"}}]},
    {"reasoning": "Thinking — ünï 中文 🚀", "content": "Answer — ünï 中文 🚀 done."},
    {"content": "\n\nLeading blank lines", "tool_calls": [{"name": "read_file", "arguments": {"path": "q"}}]},
    {"tool_calls": [{"name": "read_file", "arguments": '{"path":"compact.md"}'}]},  # hermes streams it as written
]


def cases(tokenizer_dir):
    """Every (template, thinking, tools, step, truncation) the double can answer, with its stream inputs."""
    from transformers import AutoTokenizer

    from polar.doubles.model_format import ModelFormat
    from polar.doubles.script import Step

    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    for name in TEMPLATES:
        template = tokenizer.chat_template if name == "own" else real_template(name).read_text()
        fmt = ModelFormat.for_template(template)
        for thinking in (True, False):
            if name == "qwen3-coder" and thinking:
                continue  # vLLM's qwen3 reasoning parser reads this template's answers as reasoning: see the report
            for tools in (TOOLS, []):
                for n, raw in enumerate(STEPS):
                    step = Step.of(raw)
                    if step.tool_calls and not tools:
                        continue
                    prompt = tokenizer.apply_chat_template(
                        [{"role": "user", "content": "hi"}], tools=tools or None, chat_template=template,
                        add_generation_prompt=True, tokenize=False, enable_thinking=thinking)
                    ids = tokenizer.encode(fmt.completion(step, prompt), add_special_tokens=False) + [eos]
                    for cut in (None, 7):
                        yield {"label": f"{name}/{'think' if thinking else 'no-think'}/{'tools' if tools else 'none'}"
                                        f"/{n}/{cut or 'whole'}",
                               "family": fmt.family, "mode": fmt.reasoning_mode(prompt),
                               "vllm": {"model_dir": str(tokenizer_dir),
                                        "tool_parser": "hermes" if fmt.family == "qwen3" else "qwen3_coder",
                                        "tools": tools, "kwargs": {"enable_thinking": thinking},
                                        "prompt_ids": tokenizer.encode(prompt, add_special_tokens=False),
                                        "output_ids": ids[:cut] if cut else ids, "eos_ids": [eos]}}


def double_of(tokenizer, case: dict):
    """What the stream helpers read of a ScriptedVLLM."""
    from types import SimpleNamespace

    return SimpleNamespace(tokenizer=tokenizer, eos_id=case["vllm"]["eos_ids"][0],
                           think_start_id=tokenizer.convert_tokens_to_ids("<think>"),
                           think_end_id=tokenizer.convert_tokens_to_ids("</think>"))


def double_stream(tokenizer, case: dict) -> tuple[list[dict | None], list[int]]:
    """The double's delta per token, and its reasoning-token count after each token."""
    from polar.doubles.deltas import DeltaParser
    from polar.doubles.stream import Sample, pieces, reasoning_counts

    spec = case["vllm"]
    double = double_of(tokenizer, case)
    ids = spec["output_ids"]
    finish = "stop" if ids[-1] == double.eos_id else "length"
    parser = DeltaParser(case["family"], case["mode"], spec["tools"])
    texts = pieces(double, Sample(spec["prompt_ids"], ids, finish, None), None)
    deltas = [parser.feed(piece, finished=k == len(ids) - 1) for k, piece in enumerate(texts)]
    counts = reasoning_counts(double, spec["prompt_ids"], ids, case["mode"] != "none")
    return deltas, counts


def whole_message(tokenizer, case: dict) -> tuple:
    """The double's non-streamed message for the case's sample: (reasoning or None, content or None, calls)."""
    from polar.doubles.model_format import parse_completion

    spec = case["vllm"]
    ids = spec["output_ids"][:-1] if spec["output_ids"][-1] in spec["eos_ids"] else spec["output_ids"]
    reasoning, content, calls = parse_completion(tokenizer.decode(ids, skip_special_tokens=False),
                                                 case["mode"] != "none", spec["tools"], case["family"])
    return reasoning or None, content or None, [(c["name"], json.loads(c["arguments"])) for c in calls]


def without_ids(delta: dict | None) -> dict | None:
    """Tool-call ids are random on both sides."""
    if delta is None:
        return None
    calls = [{**c, "id": "ID"} if "id" in c else c for c in delta.get("tool_calls", [])]
    return {**delta, "tool_calls": calls} if calls else delta


def test_streamed_deltas_are_vllms(tokenizer_dir):
    from transformers import AutoTokenizer

    from polar.doubles.stream import reasoning_counts

    python = require_vllm_venv()
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    todo = list(cases(tokenizer_dir))
    run = subprocess.run([str(python), str(REPO / "tests" / "support" / "vllm_parse.py")],
                         input=json.dumps([c["vllm"] for c in todo]), capture_output=True, text=True, check=False,
                         timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    results = json.loads(run.stdout.strip().splitlines()[-1])
    wrong = []
    for case, theirs in zip(todo, results, strict=True):
        deltas, counts = double_stream(tokenizer, case)
        ours = [without_ids(d) for d in deltas]
        expected = [without_ids(d) for d in theirs["deltas"]]
        if counts != theirs["reasoning_tokens"]:
            wrong.append(f"{case['label']}: reasoning tokens, double {counts} vLLM {theirs['reasoning_tokens']}")
        if ours != expected:
            first = next(k for k, (a, b) in enumerate(zip(ours, expected, strict=True)) if a != b)
            wrong.append(f"{case['label']} token {first}: double {ours[first]} vLLM {expected[first]}")
        plain = whole_message(tokenizer, case)
        if case["label"].endswith("/whole") and plain != (theirs["reasoning"], theirs["content"], [(c["name"], json.loads(c["arguments"])) for c in theirs["calls"]]):
            wrong.append(f"{case['label']}: whole answer, double {plain} vLLM {theirs['reasoning']!r} "
                         f"{theirs['content']!r} {theirs['calls']}")
        whole = reasoning_counts(double_of(tokenizer, case), case["vllm"]["prompt_ids"], case["vllm"]["output_ids"],
                                 case["mode"] != "none", streamed=False)[-1]
        if whole != theirs["reasoning_tokens_whole"]:
            wrong.append(f"{case['label']}: plain reasoning tokens, double {whole} vLLM {theirs['reasoning_tokens_whole']}")
    assert not wrong, f"{len(wrong)} of {len(todo)} streams differ:\n" + "\n".join(wrong)
    assert len(todo) > 80
