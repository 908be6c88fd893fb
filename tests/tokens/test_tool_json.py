"""Tools prepared once per tool (polar/tokens/tool_json.py) render exactly as transformers renders plain tool dicts,
for the project template and every reference one: whole conversations, continuations, on the first render and
on later ones that reuse the kept copies and texts; tools equal in Python but not in JSON stay apart."""

from __future__ import annotations

import pytest

from polar.canonical import Tool
from polar.tokens import tool_json
from polar.tokens.messages import to_openai_tools
from tests.tokens.conftest import TEMPLATES
from tests.tokens.test_template import SHAPES, shape

TOOLS = [
    Tool(name="bash", description="Run a shell command «safely» — 日本",
         parameters={"type": "object", "properties": {"cmd": {"type": "string"},
                                                      "timeout": {"type": "integer", "default": 30, "maximum": 1.5e3}},
                     "required": ["cmd"]}),
    Tool(name="read_file", description="", parameters={"type": "object", "properties": {
        "path": {"type": "string", "description": "a path\nwith a newline"}, "all": {"type": "boolean", "default": True},
        "offset": {"type": ["integer", "null"], "default": None}}}),
    Tool(name="empty", description=None, parameters={"type": "object", "properties": {}}),
]


def _plain(tools: list[Tool]) -> list[dict]:
    return [dict(d) for d in to_openai_tools(tools)]  # transformers' own path: plain dicts every render


@pytest.mark.parametrize("name", TEMPLATES)
@pytest.mark.parametrize("thinking", [True, False])
def test_renders_are_transformers_own(load, name, thinking):
    template = load(name)
    for shape_name in SHAPES:
        before, sampled, after = shape(shape_name, thinking)
        messages = [*before, sampled, *after]
        expected = template.render(messages, _plain(TOOLS), True, thinking)
        for _ in range(3):  # the first render makes the copies, later ones reuse them and their texts
            assert template.render(messages, TOOLS, True, thinking) == expected, shape_name
        plain = template.continuation(after, _plain(TOOLS), thinking, previous_ended_with_eos=True)
        kept = template.continuation(after, TOOLS, thinking, previous_ended_with_eos=True)
        assert (kept.text, kept.ids, kept.failure) == (plain.text, plain.ids, plain.failure)
    assert template.render([{"role": "user", "content": "hi"}], [], True, thinking) == \
        template.render([{"role": "user", "content": "hi"}], None, True, thinking)


@pytest.mark.parametrize("name", TEMPLATES)
def test_tools_equal_in_python_but_not_in_json_render_apart(load, name):
    """1, 1.0 and True are == in Python; a template writes them as written. Each tool keeps its own copy."""
    template = load(name)
    tools = [Tool(name="t", description="d", parameters={"type": "object", "properties": {"n": {"default": v}}})
             for v in (1, 1.0, True)]
    user = [{"role": "user", "content": "go"}]
    rendered = [template.render(user, [tool], True) for tool in tools]
    assert rendered == [template.render(user, _plain([tool]), True) for tool in tools]
    if any("default" in text for text in rendered):  # a template that writes the schema shows the difference
        assert len(set(rendered)) == 3


def test_the_kept_texts_are_bounded(load, monkeypatch):
    template = load("project")
    monkeypatch.setattr(tool_json, "KEPT", 3)
    user = [{"role": "user", "content": "go"}]
    for n in range(8):
        tool = Tool(name=f"t{n}", description="d", parameters={"type": "object", "properties": {}})
        assert template.render(user, [tool], True) == template.render(user, _plain([tool]), True)
        assert len(tool_json._json) <= 3
