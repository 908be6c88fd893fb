"""gpt-oss's harmony template, token-faithfully: continuing a sampled turn, and the template's history rule on ids.

The template renders a tool result as from the calling function (`<|start|>functions.NAME to=assistant<|channel|>
commentary<|message|>"…"<|end|>`, NAME from the assistant turn before it), so the probe turn the new messages are
rendered after carries the sampled turn's own call names. Within a tool loop the next prompt extends the last one
exactly: the model stopped at `<|call|>`, which is how the template writes a call in history too.

A final answer ends with `<|return|>`, which the template writes only as the last token of a training example: in
history it writes `<|end|>`, and it drops every analysis message before the last final answer. Once a final answer
is followed by new messages, the next prompt applies that rule to the ids themselves: the analysis messages are cut
out and the `<|return|>` becomes `<|end|>`; every other id, sampled or not, stays as it was (never re-encoded). The
prompt then no longer extends the previous one: a new trajectory segment starts there (the capture's prompt_mode
says so), and it is the prompt the model was trained to see, which keeping `<|return|>` mid-context would not be.
Other templates' history rules (Qwen3.5 dropping earlier reasoning) are not applied: there the sampled turn is a
valid context as it is.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

START, MESSAGE, END, CALL, RETURN = "<|start|>", "<|message|>", "<|end|>", "<|call|>", "<|return|>"
HISTORY_RULE = "harmony history rule applied to the ids: analysis before the final answer cut out, <|return|> → <|end|>"
_ANALYSIS = "assistant<|channel|>analysis"


_REASONING = ("reasoning_content", "reasoning", "thinking")


def template_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The template reads reasoning from `thinking` (transformers fills it from `reasoning_content`) and refuses it
    beside the text of a tool-calling turn: there the text goes alone, written as the analysis (a re-render loses that
    turn's reasoning; a continuation keeps the sampled ids, both messages)."""
    out = []
    for m in messages:
        if m.get("role") == "assistant" and m.get("tool_calls") and m.get("content"):
            m = {k: v for k, v in m.items() if k not in _REASONING}
        out.append(m)
    return out


def new_messages_text(rendered: str, sentinel: str, calls: Sequence[str]) -> str | None:
    """What the template wrote after the probe turn (which held `sentinel`, then `calls`): the new messages and the
    generation prompt; None when the probe turn does not end as a sampled turn would."""
    at = rendered.rfind(sentinel)
    end = CALL if calls else END
    stop = rendered.find(end, at)
    return None if at < 0 or stop < 0 else rendered[stop + len(end) :]


def apply_history_rule(ids: np.ndarray, tokenizer: Any) -> np.ndarray | None:
    """`ids` (a prompt and the final answer sampled after it, `<|return|>` last) as the template writes that history
    once a message follows: every assistant analysis message cut out, `<|return|>` → `<|end|>`. None: not a final."""
    special = tokenizer.convert_tokens_to_ids([START, MESSAGE, END, RETURN])
    start, message, end, ret = (int(i) for i in special)
    if len(ids) == 0 or int(ids[-1]) != ret:
        return None
    starts = [*np.flatnonzero(ids == start).tolist(), len(ids)]
    kept = [ids[: starts[0]]]
    for a, b in zip(starts, starts[1:]):
        head = ids[a:b]
        at = np.flatnonzero(head == message)
        header = tokenizer.decode(head[1 : at[0]].tolist()) if len(at) else ""
        if header.strip() != _ANALYSIS:  # analysis sent to a recipient (a tool call in it) stays
            kept.append(head)
    out = np.concatenate(kept).copy()
    out[-1] = end
    return out
