"""Family detection on every family's real template (the llama-cpp-python sdist's copies), and never silent:
token-faithful mode refuses a template whose output polar cannot read, `polar templates check` says why."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from polar.cli import main
from polar.tokens.families import FAMILIES, UnknownTemplate, detect, require_token_faithful
from polar.tokens.template import ChatTemplate
from tests.conftest import FAMILY_TEMPLATES, family_template
from tests.tokens.conftest import PROJECT_TEMPLATE

# Real template label → the family it teaches (vLLM's parser names are in families.py).
EXPECTED = {
    "qwen2.5": "qwen3", "qwen3": "qwen3", "qwen3-coder": "qwen3-xml", "qwen3.5": "qwen3-xml",
    "glm-4.6": "glm-4.5", "glm-4.7": "glm-4.7", "gpt-oss": "gpt-oss", "deepseek-v3.1": "deepseek-v3.1",
    "deepseek-v3.2": "deepseek-v3.2", "deepseek-v4": "deepseek-v4", "kimi-k2": "kimi-k2",
    "kimi-k2-instruct": "kimi-k2", "kimi-k2-thinking": "kimi-k2", "minimax-m2": "minimax-m2",
    "llama-3.3": "llama3-json", "devstral": "mistral", "mistral-small-3.2": "mistral",
    "nemotron-3-nano": "nemotron-3",
}  # fmt: skip
# llama.cpp's copies of these use `list.append`, which transformers' sandbox (vLLM's renderer) refuses once a
# conversation holds a tool call; polar renders them in jinja2's sandbox that allows it (polar/tokens/sandbox.py).
VLLM_UNRENDERABLE = {"kimi-k2-instruct", "kimi-k2-thinking"}
TOY = "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"


def test_every_real_template_is_recognised():
    assert set(EXPECTED) == set(FAMILY_TEMPLATES)
    found = {label: getattr(detect(family_template(label).read_text()), "name", None) for label in EXPECTED}
    assert found == EXPECTED
    assert {f.name for f in FAMILIES} == set(EXPECTED.values())  # every family has its real template here


@pytest.mark.parametrize("look_alike", ["deepseek-ai-DeepSeek-R1-Distill-Qwen-32B", "meetkai-functionary-medium-v3.1",
                                        "google-gemma-2-2b-it"])
def test_look_alikes_and_toys_are_not_classified(look_alike):
    """R1 writes `function<｜tool▁sep｜>NAME` + a ```json fence, functionary `<function=NAME>` on Llama's headers."""
    assert detect((family_template("qwen3").parent / f"{look_alike}.jinja").read_text()) is None
    assert detect(TOY) is None


def test_token_faithful_refuses_an_unknown_template_naming_the_families(tokenizer_dir, tmp_path):
    toy = tmp_path / "toy.jinja"
    toy.write_text(TOY)
    with pytest.raises(UnknownTemplate, match="'toy' is not one polar can classify") as err:
        ChatTemplate.from_dir(tokenizer_dir, toy)
    assert all(f.name in str(err.value) for f in FAMILIES) and "chat mode" in str(err.value)
    assert ChatTemplate.from_dir(tokenizer_dir, PROJECT_TEMPLATE).family == "qwen3_xml"


def test_a_family_without_a_parser_is_refused_by_name():
    unparsed = [f for f in FAMILIES if not f.parser]
    for family in unparsed:
        label = next(lbl for lbl, name in EXPECTED.items() if name == family.name)
        with pytest.raises(UnknownTemplate, match=f"is {family.name} .*cannot parse yet.*`{family.tool_parser}`"):
            require_token_faithful(family_template(label).read_text())


def test_cli_lists_the_families():
    out = CliRunner().invoke(main, ["templates"])
    assert out.exit_code == 0
    for f in FAMILIES:
        assert f.name in out.output and f.tool_parser in out.output


@pytest.mark.parametrize("label,family", [("gpt-oss", "harmony"), ("glm-4.6", "glm45"), ("glm-4.7", "glm45"),
                                          ("kimi-k2-instruct", "kimi_k2"), ("kimi-k2-thinking", "kimi_k2")])
def test_gpt_oss_and_glm_continue_with_their_vocabulary(label, family, tokenizer_dir, tmp_path):
    """`polar templates check --tokenizer`: a tool result continues a sampled turn (harmony and Kimi-K2-Instruct/-Thinking
    name it after the call; GLM's stop tokens, its next turns' role tokens, come from the tokenizer's
    generation_config.json)."""
    from tests.support.stand_in import stand_in_dir

    require_token_faithful(family_template(label).read_text())
    vocab = stand_in_dir(tokenizer_dir, tmp_path / "vocab", family)
    out = CliRunner().invoke(main, ["templates", "check", str(family_template(label)), "--tokenizer", str(vocab)])
    assert out.exit_code == 0 and "token-faithful: yes" in out.output, out.output


@pytest.mark.parametrize("label", list(EXPECTED))
def test_cli_check_on_each_real_template(label):
    path = family_template(label)
    family = detect(path.read_text())
    out = CliRunner().invoke(main, ["templates", "check", str(path), "--json"])
    report = json.loads(out.output.splitlines()[-1])  # (transformers may say first that torch is absent)
    assert (report["family"], report["vllm_tool_parser"]) == (family.name, family.tool_parser)
    works = bool(family.parser) and not family.no_continuation
    assert report["token_faithful"] is works and out.exit_code == (0 if works else 1), report["why_not"]
    if label in VLLM_UNRENDERABLE:  # a trait: chat mode cannot send vLLM a tool call, token-faithful mode runs
        assert "append" in report["traits"]["vllm_tool_call_error"] and "SecurityError" in report["vllm_chat"]
        assert "token-faithful mode renders it" in report["vllm_chat"]
    else:
        assert report["traits"]["vllm_tool_call_error"] is None and report["vllm_chat"] is None
    assert report["traits"]["system_at_start"] in (True, False)


def test_cli_check_refuses_unknown_and_unreadable(tmp_path, tokenizer_dir):
    toy = tmp_path / "toy.jinja"
    toy.write_text(TOY)
    out = CliRunner().invoke(main, ["templates", "check", str(toy)])
    assert out.exit_code == 1 and "family: unknown" in out.output and "qwen3-xml" in out.output
    assert CliRunner().invoke(main, ["templates", "check", str(tmp_path / "none.jinja")]).exit_code == 2
    ok = CliRunner().invoke(main, ["templates", "check", str(PROJECT_TEMPLATE), "--tokenizer", str(tokenizer_dir)])
    assert ok.exit_code == 0 and "token-faithful: yes" in ok.output


def test_the_token_faithful_backend_refuses_to_start_on_an_unknown_template(tokenizer_dir, tmp_path):
    """What `polar proxy --tokenizer … --chat-template …` builds (polar/upstream/fleet/build.py) raises before
    serving; without a tokenizer (chat mode: vLLM renders and parses) the same template is taken."""
    from polar.upstream.fleet.build import upstream_backend

    toy = tmp_path / "toy.jinja"
    toy.write_text(TOY)
    with pytest.raises(UnknownTemplate, match="not one polar can classify"):
        upstream_backend(["http://127.0.0.1:9"], tokenizer=str(tokenizer_dir), chat_template=str(toy))
    assert upstream_backend(["http://127.0.0.1:9"], chat_template=str(toy)) is not None
