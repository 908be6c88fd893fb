"""Chat templates over the real Qwen3.5 vocabulary: the project's own, and the reference ones in ../shared."""

from __future__ import annotations

import pytest

from polar.tokens import ChatTemplate
from tests.conftest import REPO, SHARED_TEMPLATES, real_template

PROJECT_TEMPLATE = REPO / "data" / "chat_templates" / "qwen3.5-xml-tools.jinja"
# "project" is data/chat_templates (always present); the others are ../shared/reference/templates
TEMPLATES = ["project", *SHARED_TEMPLATES]


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
                text = real_template(name).read_text()
            _templates[name] = ChatTemplate(tokenizer, text, name=name)
        return _templates[name]

    return get
