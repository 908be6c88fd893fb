"""A request that repeats an earlier turn's answer without extending that turn: its sampled ids spliced in.

Harnesses edit their history between calls. OpenClaw ends every request with a runtime-context user
message that moves to the end on the next call: call n+1 holds call n's messages up to that context
message, then call n's answer, then the tool results and the moved context. No earlier call is a
prefix of it, and a whole re-render would re-encode every sampled turn from text.

Here the prompt is the earlier turn's own ids cut where its first dropped message began, then its
generation prompt and sampled ids exactly as sampled, then the template's rendering of only the new
messages (the extension path's continuation). Each turn's prompt carries the turns before it the same
way, so every sampled assistant turn reaches every later prompt token for token.

The cut is found by counting turn markers (ChatML's `<|im_start|>`), and taken only where it is safe:
the block before the cut must decode to exactly what the template renders there (so a grouped block,
or a marker the model sampled, cannot shift it), and the turn's prompt must end with the generation
prompt this request would get. Otherwise the request is re-rendered whole, as before.

A spliced call's prompt is not the last call's sequence, so it starts a trajectory of its own. With
`polar_dropped_messages=keep` (a runtime sets it per session for a harness that declares it) the earlier turn
is extended whole instead: the dropped messages stay where the model saw them, every call extends the last and
the session is one trajectory, each sampled turn in the context it was sampled in. The model then reads the
earlier copies of a moved message too, so it is for messages a harness re-sends as snapshots (OpenClaw's
runtime context, whose system prompt says the latest snapshot supersedes older ones).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from polar.canonical import ChatRequest
from polar.errors import GatewayError
from polar.sessions.shared_ids import SharedIds
from polar.sessions.state import Extension, Reappearance
from polar.tokens.messages import to_openai_messages
from polar.tokens.template import ChatTemplate, openai_tools

SPLICED = "kept the sampled ids of a turn the harness moved messages around"
# polar_dropped_messages=keep: the earlier turn extended whole instead, the dropped messages left in place.
KEPT = "kept the messages the harness dropped before a repeated answer where the model saw them"


def splice(found: Reappearance, request: ChatRequest, template: ChatTemplate) -> tuple[Extension | None, str]:
    """The earlier turn as if its request had held only the messages this request keeps, extended by the
    new messages; or None and why the cut is not safe."""
    marker = template.turn_marker()
    if marker is None:
        return None, "the template starts its turns with no added token to cut at"
    kept = [m for msg in request.messages[: found.kept] for m in to_openai_messages(msg)]
    thinking = request.thinking.enabled
    try:
        before = template.render(kept, openai_tools(request.tools) or None, False, thinking)
    except GatewayError as exc:
        return None, f"the template cannot render the kept messages alone: {exc.message}"
    turn = found.turn
    ids = turn.ids.array()
    prompt = ids[: turn.prompt_len]
    starts = np.flatnonzero(prompt == template.tokenizer.convert_tokens_to_ids(marker))
    blocks = before.count(marker)
    if not 0 < blocks < len(starts):
        return None, "the kept messages do not end on a turn boundary of the earlier prompt"
    cut, answer = int(starts[blocks]), int(starts[-1])
    if template.decode(prompt[starts[blocks - 1] : cut]) != before[before.rfind(marker) :]:
        return None, "the earlier prompt's last kept turn is not what the template renders there"
    if template.decode(prompt[answer:]) != template.generation_prompt(thinking):
        return None, "the earlier turn was sampled after another generation prompt"
    held = SharedIds((prompt[:cut], ids[answer:]))
    base = dataclasses.replace(turn, ids=held, prompt_len=cut + turn.prompt_len - answer)
    return Extension(base, found.new_messages), ""

