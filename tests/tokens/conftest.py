"""Chat templates over the real Qwen3.5 vocabulary: the project's own, and the reference ones in ../shared."""

from __future__ import annotations

import pytest

from polar.tokens import ChatTemplate
from tests.conftest import REPO

PROJECT_TEMPLATE = REPO / "data" / "chat_templates" / "qwen3.5-xml-tools.jinja"
# name → file in ../shared/reference/templates; "project" is data/chat_templates, always present
SHARED_FILES = {
    "qwen3.5-4b": "qwen3.5-4b.jinja",
    "qwen3-hybrid": "qwen3-hybrid.jinja",
    "qwen3-early": "qwen3-early.jinja",
    "qwen3-coder": "qwen3-coder.jinja",
    "qwen2.5": "qwen2.5.jinja",
}
TEMPLATES = ["project", *SHARED_FILES]


@pytest.fixture(scope="session")
def tokenizer(tokenizer_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tokenizer_dir))


@pytest.fixture(scope="session")
def _templates() -> dict[str, ChatTemplate]:
    return {}


@pytest.fixture
def load(request, tokenizer, _templates):
    """name → ChatTemplate; a ../shared template skips the test cleanly when that folder is absent."""

    def get(name: str) -> ChatTemplate:
        if name not in _templates:
            if name == "project":
                text = PROJECT_TEMPLATE.read_text()
            else:
                text = (request.getfixturevalue("shared_templates") / SHARED_FILES[name]).read_text()
            _templates[name] = ChatTemplate(tokenizer, text)
        return _templates[name]

    return get
