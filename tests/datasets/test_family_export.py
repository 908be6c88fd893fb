"""Chat rows of token-faithful sessions on other families' real templates, through the real export path, re-render to
exactly the captured tokens (`rerender_mismatch`). GLM-4.6's and GLM-4.7's model stops on the next turn's role token
(`<|user|>`, `<|observation|>`: their generation config's stop ids), which vLLM returns as the last sampled id: a
trajectory's last id is one the row's rendering does not write (the next turn never came), and it is accepted as
such; gpt-oss's last turn ends with `<|return|>`, as its template ends a conversation. Vocabulary: stand-ins
(tests/support/stand_in.py); the double samples in each family's format (the same stacks as
tests/e2e/test_token_faithful_families.py)."""

from __future__ import annotations

import uuid

import pytest

from polar.datasets import ExportConfig, Selection, export_dataset
from polar.rollout.state import RolloutState
from polar.tokens.template import ChatTemplate
from tests.conftest import family_template
from tests.datasets.test_multiturn_export import record
from tests.e2e.sessions import drive_chat
from tests.e2e.test_token_faithful_families import FAMILIES, family, family_steps, parser_of  # noqa: F401 - fixture
from tests.support.stand_in import family_dir

pytestmark = pytest.mark.slow


# (template, the session's model calls, the stop its last turn ends on): an answer, or a call
CASES = [("glm-4.6", 5, "<|user|>"), ("glm-4.7", 4, "<|observation|>"), ("gpt-oss", 5, "<|return|>")]


@pytest.mark.parametrize("family,turns,stop", CASES, indirect=["family"])
def test_family_rows_rerender_to_their_tokens(family, turns, stop, tokenizer_dir, tmp_path):  # noqa: F811 - fixture
    stack, label = family, family.template
    steps = family_steps(label, False)
    if label == "gpt-oss":  # its template writes text beside a call as analysis in a re-render (docs/templates.md)
        steps = [{**s, "content": ""} if s.get("tool_calls") else s for s in steps]
    stack.script(rules=[{"match": "[session:tf]", "steps": steps}])
    state = RolloutState(tmp_path / "rollout.db")
    task = f"{label}-{uuid.uuid4().hex[:6]}"
    results = record(state, stack, task, lambda url, s: drive_chat(url, s, thinking=False, turns=turns))
    state.close()
    vocab = family_dir(tokenizer_dir, tmp_path / "vocab", parser_of(FAMILIES[label]))  # as the stack's own
    template = ChatTemplate.from_dir(vocab, family_template(label))

    result = export_dataset(ExportConfig(state=tmp_path / "rollout.db", captures=stack.db, out=tmp_path / "out",
                                         val_fraction=0.0, template=template, formats=("jsonl",),
                                         selection=Selection(include_truncated=True)), progress=False)
    trajectories = [t for r in results for t in r.trajectories]
    assert len(trajectories) == 1 and len(trajectories[0].turns) == turns  # one token-faithful trajectory
    assert template.decode(trajectories[0].token_ids[-1:]) == stop
    assert result.stats["chat"]["rerender"] == {"checked": 1, "exact": 1, "mismatches": []}
