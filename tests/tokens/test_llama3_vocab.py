"""Llama-3's real vocabulary, built from Meta's `llama-models` package (tests/support/llama3_vocab.py), against that
package's own encoder id for id: on what the real Llama-3.3 template renders (tool calls and results, non-ASCII
text), through polar's own encoder (its ASCII path included), with the ids the template and vLLM's `llama3_json`
parser name. The families' tests run Llama-3.3 on it (`family_tokenizer`, tests/support/stand_in.py)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from polar.cli import main
from polar.tokens.encoder import IdsEncoder
from polar.tokens.template import ChatTemplate
from tests.conftest import family_template
from tests.support.llama3_vocab import llama3_vocab_dir
from tests.support.stand_in import family_tokenizer
from tests.tokens.test_template import SHAPES, TOOLS, shape


@pytest.fixture(scope="module")
def meta():
    """The package's own tokenizer (tiktoken over the same tokenizer.model)."""
    from llama_models.llama3.tokenizer import Tokenizer

    return Tokenizer.get_instance()


@pytest.fixture(scope="module")
def llama():
    return ChatTemplate.from_dir(llama3_vocab_dir(), family_template("llama-3.3"))


def meta_ids(meta, text: str) -> list[int]:
    return meta.encode(text, bos=False, eos=False, allowed_special="all")


def test_the_ids_llama3_names(llama, meta):
    """Llama-3.1+'s markup ids (Meta's model cards: <|begin_of_text|> 128000, <|eot_id|> 128009, <|python_tag|>
    128010), Llama-3.3-Instruct's stop ids, and its 128,256 ids in all."""
    tok = llama.tokenizer
    named = {t: tok.convert_tokens_to_ids(t) for t in ("<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                                                          "<|end_header_id|>", "<|eom_id|>", "<|eot_id|>", "<|python_tag|>")}
    assert named == {"<|begin_of_text|>": 128000, "<|end_of_text|>": 128001, "<|start_header_id|>": 128006,
                     "<|end_header_id|>": 128007, "<|eom_id|>": 128008, "<|eot_id|>": 128009, "<|python_tag|>": 128010}
    assert named == {t: meta.special_tokens[t] for t in named}
    assert sorted(llama.eos_token_ids) == [128001, 128008, 128009]
    assert len(tok) == meta.n_words == 128256
    assert llama.encode("Hello world") == [9906, 1917]  # llama.cpp's published ids for Meta-Llama-3


@pytest.mark.parametrize("shape_name", [s for s in SHAPES if s != "parallel_tools"])  # the template raises on those
def test_template_renders_encode_as_llama_models_does(llama, meta, shape_name):
    before, msg, new = shape(shape_name, False)
    text = llama.render([*before, msg, *new], TOOLS, True)
    assert text.startswith("<|begin_of_text|><|start_header_id|>system<|end_header_id|>")
    ids = llama.encode(text)
    assert ids == meta_ids(meta, text)
    assert ids.count(128009) == text.count("<|eot_id|>") > 1
    assert llama.tokenizer.decode(ids) == text


def test_polar_encoder_ascii_path_equals_llama_models(llama, meta):
    """polar's encoder sends ASCII runs through tiktoken with the vocabulary's own ranks: the same ids."""
    encoder = IdsEncoder(llama.tokenizer, llama.tokenizer.backend_tokenizer)
    assert encoder.ascii_path(timeout=120)
    lines = [f"    def step_{i}(self, x):  # ratio {i / 7:.3f}\n        return x ** {i} + 'done'\n" for i in range(40)]
    text = "".join(lines) + "<|eot_id|>naïve café 日本 ☕\n\n\n" + "".join(lines[:5])
    assert encoder(text) == meta_ids(meta, text)


def test_families_run_llama3_on_it(tokenizer_dir, meta):
    tok = family_tokenizer(tokenizer_dir, "llama3_json")
    text = '<|python_tag|>{"name": "bash", "parameters": {"cmd": "ls -la ~/données"}}<|eom_id|>'
    assert tok.encode(text, add_special_tokens=False) == meta_ids(meta, text)


def test_templates_check_continues_on_it():
    """`polar templates check --tokenizer` on Llama-3.3's real template and vocabulary: a tool result continues a
    sampled call."""
    out = CliRunner().invoke(main, ["templates", "check", str(family_template("llama-3.3")),
                                    "--tokenizer", str(llama3_vocab_dir())])
    assert out.exit_code == 0 and "token-faithful: yes" in out.output, out.output
