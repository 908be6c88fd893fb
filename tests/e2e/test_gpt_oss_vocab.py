"""A token-faithful gpt-oss session on gpt-oss's own vocabulary (o200k_harmony from `openai-harmony`,
tests/support/harmony_vocab.py) and its real harmony template: the OpenAI Responses SDK drives the scripted session
through polar, the double samples harmony in those ids. Every prompt extends the previous prompt + sampled ids, except
after a final answer and a user message, where it is the earlier ids under the template's history rule
(polar/tokens/harmony_turns.py); the ids are gpt-oss's own (`<|call|>` 200012, `<|return|>` 200002)."""

from __future__ import annotations

import shutil
import uuid
from itertools import pairwise

import httpx
import numpy as np
import pytest

from polar.tokens.harmony_turns import HISTORY_RULE, apply_history_rule
from tests.conftest import family_template, subprocess_stack
from tests.e2e.sessions import TURNS, drive_responses
from tests.e2e.test_token_faithful_families import family_steps
from tests.support.harmony_vocab import harmony_vocab_dir

# a double and a gateway process of its own; the vocabulary is built in the vLLM venv (once, into the cache)
pytestmark = [pytest.mark.slow, pytest.mark.vllm]


@pytest.fixture(scope="module")
def gpt_oss(tmp_path_factory):
    template = family_template("gpt-oss")
    vocab = tmp_path_factory.mktemp("o200k_harmony") / "tokenizer"
    shutil.copytree(harmony_vocab_dir(), vocab)  # with the model's own template, as a model directory holds it
    (vocab / "chat_template.jinja").write_text(template.read_text())
    with subprocess_stack(vocab, template, "gpt-oss", vocab.parent / "capture.db") as stack:
        yield stack


def test_session_on_o200k_harmony(gpt_oss):
    stack = gpt_oss
    assert httpx.get(f"{stack.upstream_url}/_double/template").json()["family"] == "gpt-oss"
    session = f"tf-o200k-{uuid.uuid4().hex[:6]}"
    stack.script(rules=[{"match": "[session:tf]", "steps": family_steps("gpt-oss", True)}])
    drive_responses(stack.url, session, True)
    rows = stack.rows(session)
    assert len(rows) == TURNS and all(r["status"] == "ok" for r in rows), [(r["status"], r["error"]) for r in rows]
    ruled = 0
    for prev, row in pairwise(rows):
        assert row["prompt_mode"].startswith("token-faithful"), row["prompt_mode"]
        full = prev["prompt_ids"] + prev["completion_ids"]
        if HISTORY_RULE in row["prompt_mode"]:
            assert prev["completion_ids"][-1] == 200002  # <|return|>
            full = apply_history_rule(np.array(full), stack.double.tokenizer).tolist()
            assert full[-1] == 200007 and 200002 not in full  # <|end|>
            ruled += 1
        assert row["prompt_ids"][: len(full)] == full
    assert ruled == 2
    calls = [r for r in rows if r["finish_reason"] == "tool_calls"]
    assert len(calls) == 7 and all(r["completion_ids"][-1] == 200012 for r in calls)  # <|call|>
    assert "<|channel|>analysis<|message|>I should look at the code first.<|end|>" in stack.double.tokenizer.decode(
        rows[1]["prompt_ids"])
