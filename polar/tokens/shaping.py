"""Messages the served model's own chat template accepts, and a note for every rewrite.

Harnesses send what their provider takes: Codex sends `instructions` plus several `developer`
items (all system messages once normalised, see polar/canonical.py), and more developer items between
turns; any client may send an image. The real templates differ in what they
take, so `TemplateTraits` finds out by rendering small probe conversations with the template
itself (never by its name), once per template text:

| template     | several leading systems | a system after the start  | developer role   | images                |
|--------------|-------------------------|---------------------------|------------------|-----------------------|
| Qwen3.5-4B   | raises "System message must be at the beginning" | raises (same) | raises | vision tokens |
| Qwen3 hybrid | renders each            | renders it in place       | dropped silently | content dropped silently |
| Qwen3 early  | renders each            | renders it in place       | dropped silently | raises                |
| Qwen3-Coder  | renders each            | renders it in place       | renders it       | raises                |
| Qwen2.5      | renders each            | renders it in place       | dropped silently | raises                |

("dropped silently" is why a probe counts a message as taken only when its text shows.)

`shape` then rewrites a canonical request, the same way for every call of a session:

- Leading system messages (instructions, system, developer) merge into one system message, texts
  joined by a blank line, on every template: Qwen3.5 takes no other form, the Qwen models are
  trained with one system turn, and the tool catalogue the templates write into the first system
  turn then sits with all the instructions.
- A system message later in the conversation stays a system message where the template renders
  it in place (Qwen3 hybrid, Qwen3-Coder, Qwen2.5: `<|im_start|>system` mid-conversation is what
  vLLM would render too). Where the template refuses it (Qwen3.5: "System message must be at the
  beginning"), drops it, or writes it elsewhere (DeepSeek's: into the system prompt at the start, before
  ids already sampled), it becomes a user message wrapped in `<system>…</system>`, so the model still sees
  it as an instruction and not as the user's words. It is never merged into a neighbouring user
  message: that would rewrite an earlier message when the next one arrives and break the
  token-faithful prefix.
- Images on a template that renders none (or raises on them) are a 400 `invalid_request`: polar
  will not drop what the client sent. Images in a system message are refused everywhere.
- Tool-call ids, where the template takes only 9 alphanumerics (Mistral-Small-3.2: "Tool call IDs
  should be alphanumeric strings with length 9!"): an id already so is kept (the model writes its own
  as `[CALL_ID]…`, and polar hands that one to the harness, so it comes back as the model wrote it); any
  other becomes 9 alphanumerics from its hash, in the calling turn and its result alike. The harness
  never sees the mapped id: its own comes back to it, and maps the same way on every later call.
- A user message where the template refuses one (Mistral-Small-3.2 makes roles alternate, counting
  neither tool results nor calling turns: "After the optional system message, conversation roles must
  alternate user/assistant/user/assistant/..."): right after a tool result it is carried at the end of that
  result, in `<user>…</user>` tags (a late system message keeps its `<system>` tags), as Codex's developer
  item after a tool output and Claude Code's text beside its tool results are; right after another user
  message it joins that one after a blank line, as mistral-common joins consecutive user messages. Both
  messages came in the same request (the model's answer would stand between them otherwise), so a longer
  conversation still shapes to an extension of the shorter one.

Every rewrite depends only on the message itself and the one before it, so shaping a longer conversation
extends the shaped shorter one: token faithfulness is unaffected.
"""

from __future__ import annotations

import functools
import hashlib
import re
from dataclasses import dataclass
from typing import Any

from polar.canonical import ChatRequest, Message, TextPart, holds_image
from polar.errors import GatewayError
from polar.tokens.sandbox import SecurityError, render_with_own_data, vllm_render_error

LATE_SYSTEM_OPEN, LATE_SYSTEM_CLOSE = "<system>\n", "\n</system>"
USER_OPEN, USER_CLOSE = "<user>\n", "\n</user>"  # a user message carried in a tool result
_S = "polar-shape-probe-"  # sentinels: a probe counts a message as rendered only if its text shows


@dataclass(frozen=True)
class TemplateTraits:
    """What a chat template accepts, measured by rendering probe conversations with it."""

    system_at_start: bool  # a system message first is rendered
    several_systems: bool  # two leading system messages are both rendered
    late_system: bool  # a system message after an exchange is rendered in place
    developer_role: bool  # a "developer" message is rendered (polar sends none: canonical has none)
    images: bool  # an image part is rendered (something written for it, the text beside it kept)
    tool_role: bool  # a tool message is rendered
    nine_char_call_ids: bool = False  # tool-call ids must be 9 alphanumerics (other ids raise)
    late_system_error: str | None = None  # what the template says when it refuses a late system message
    # What vLLM's renderer raises on a conversation holding a tool call, where polar renders it (the template changes
    # its own lists: polar/tokens/sandbox.py): chat mode cannot send one to vLLM, token-faithful mode runs
    vllm_tool_call_error: str | None = None
    user_after_tool: bool = True  # a user message right after a tool result is rendered
    consecutive_users: bool = True  # a user message right after another is rendered
    label: str = "the chat template"  # names the template in rewrite notes

    @classmethod
    def of(cls, template_text: str, label: str | None = None) -> TemplateTraits:
        """The traits of this template text (probed once per text, then cached)."""
        return cls(**_probe(template_text), label=label or "the chat template")


# When polar does not know the served template (chat mode without `polar_chat_template`): only the
# rewrite every template takes — leading system messages merged — and the rest left to vLLM's answer.
ANY_TEMPLATE = TemplateTraits(system_at_start=True, several_systems=True, late_system=True, developer_role=True,
                              images=True, tool_role=True, label="the served model's template")


def shape(request: ChatRequest, traits: TemplateTraits) -> tuple[ChatRequest, list[str]]:
    """The request as the template accepts it, and one human-readable line per rewrite.

    Pure: `request` is not modified. Raises GatewayError("invalid_request") for content the
    template cannot take (images on a text-only template, images in a system message).
    """
    notes: list[str] = []
    _check_images(request.messages, traits)
    lead = 0
    while lead < len(request.messages) and request.messages[lead].role == "system":
        lead += 1
    messages: list[Message] = []
    if lead >= 2:
        texts = [m.text() for m in request.messages[:lead]]
        messages.append(Message(role="system", content=[TextPart(text="\n\n".join(t for t in texts if t))]))
        notes.append(f"merged {lead} leading system/developer messages into one system message")
    else:
        messages.extend(request.messages[:lead])
    for at, msg in enumerate(request.messages[lead:], start=lead):
        if msg.role == "system" and not traits.late_system:
            text = LATE_SYSTEM_OPEN + msg.text() + LATE_SYSTEM_CLOSE
            messages.append(Message(role="user", content=[TextPart(text=text)]))
            why = (f"refuses a system message after the start ({traits.late_system_error})" if traits.late_system_error
                   else "renders no system message in place after the start")
            notes.append(f"system message at position {at} carried as a user message in <system> tags: "
                         f"{traits.label} {why}")
        elif msg.role == "tool" and not traits.tool_role:
            raise GatewayError("invalid_request", f"messages[{at}] is a tool result, but {traits.label} has no tool role",
                               param=f"messages[{at}]")
        else:
            messages.append(_nine_char_ids(msg, notes, traits) if traits.nine_char_call_ids else msg)
        _join_refused_user(messages, at, notes, traits)
    if not notes:
        return request, notes
    return request.model_copy(update={"messages": messages}), notes


_NINE = re.compile(r"[A-Za-z0-9]{9}")
_ALNUM = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"


def nine_char_id(call_id: str) -> str:
    """The id as 9 alphanumerics: itself when it is, else from its hash (the same on every call)."""
    if _NINE.fullmatch(call_id):
        return call_id
    n = int.from_bytes(hashlib.sha256(call_id.encode()).digest()[:8], "big")
    return "".join(_ALNUM[(n // 62**i) % 62] for i in range(9))


def _nine_char_ids(msg: Message, notes: list[str], traits: TemplateTraits) -> Message:
    ids = [c.id for c in msg.tool_calls or []] + ([msg.tool_call_id] if msg.role == "tool" and msg.tool_call_id else [])
    mapped = {i: nine for i in ids if (nine := nine_char_id(i)) != i}
    if not mapped:
        return msg
    notes.append(f"tool-call ids {', '.join(f'{a} → {b}' for a, b in mapped.items())}: {traits.label} takes only "
                 f"9 alphanumerics")
    if msg.role == "tool":
        return msg.model_copy(update={"tool_call_id": mapped[msg.tool_call_id]})
    calls = [c.model_copy(update={"id": mapped.get(c.id, c.id)}) for c in msg.tool_calls]
    return msg.model_copy(update={"tool_calls": calls})


def _join_refused_user(messages: list[Message], at: int, notes: list[str], traits: TemplateTraits) -> None:
    """The last message, a user one the template refuses after the one before it, joined to that one."""
    if traits.user_after_tool and traits.consecutive_users:  # most templates: nothing to look at
        return
    if len(messages) < 2 or messages[-1].role != "user" or any(map(holds_image, messages[-2:])):
        return
    before, text = messages[-2], messages[-1].text()
    if before.role == "tool" and not traits.user_after_tool:
        carried = text if text.startswith(LATE_SYSTEM_OPEN) else USER_OPEN + text + USER_CLOSE
        where = "carried at the end of the tool result before it"
    elif before.role == "user" and not traits.consecutive_users:
        carried, where = text, "joined to the user message before it"
    else:
        return
    messages[-2:] = [before.model_copy(update={"content": [TextPart(text=before.text() + "\n\n" + carried)]})]
    notes.append(f"user message at position {at} {where}: {traits.label} makes roles alternate")


def _check_images(messages: list[Message], traits: TemplateTraits) -> None:
    for at, msg in enumerate(messages):
        if not holds_image(msg):
            continue
        if msg.role == "system":
            raise GatewayError("invalid_request", f"messages[{at}] is a system message holding an image; "
                               "images belong in user messages", param=f"messages[{at}]")
        if not traits.images:
            raise GatewayError("invalid_request", f"messages[{at}] holds an image, but the served model's chat "
                               f"template ({traits.label}) takes text only", param=f"messages[{at}]")


# -- probing -------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=64)
def _probe(text: str) -> dict[str, Any]:
    user = {"role": "user", "content": _S + "user"}
    exchange = [user, {"role": "assistant", "content": _S + "assistant"}]
    late_text, late_error = _render(text, [*exchange, _sys("late"), {"role": "user", "content": _S + "again"}])
    # in place: between the turns it was sent between (DeepSeek's templates write every system message at the start)
    late = late_text is not None and -1 < late_text.find(_S + "assistant") < late_text.find(_S + "late") < (
        late_text.find(_S + "again"))
    image = [{"type": "image_url", "image_url": {"url": "data:image/png;base64,"}}, {"type": "text", "text": _S + "pic"}]
    with_image, _ = _render(text, [{"role": "user", "content": image}])
    text_only, _ = _render(text, [{"role": "user", "content": [image[1]]}])

    def tool_turn(call_id: str) -> list[dict]:
        call = {"type": "function", "function": {"name": "probe", "arguments": {}}, "id": call_id}
        return [user, {"role": "assistant", "content": "", "tool_calls": [call]},
                {"role": "tool", "tool_call_id": call_id, "content": _S + "tool"}]

    any_id = _renders(text, tool_turn("probe-1"), "tool")[0]
    vllm = vllm_render_error(text, tool_turn("probe0001"), None, add_generation_prompt=True)
    nine = not any_id and _renders(text, tool_turn("probe0001"), "tool")[0]
    again = {"role": "user", "content": _S + "again"}
    return {
        "system_at_start": _renders(text, [_sys("first"), user], "first")[0],
        "several_systems": _renders(text, [_sys("one"), _sys("two"), user], "one", "two")[0],
        "late_system": late,
        "late_system_error": late_error,
        "developer_role": _renders(text, [{"role": "developer", "content": _S + "dev"}, user], "dev")[0],
        "images": bool(with_image) and _S + "pic" in with_image and with_image != text_only,
        "tool_role": any_id or nine,
        "nine_char_call_ids": nine,
        "vllm_tool_call_error": f"{type(vllm).__name__}: {vllm}" if isinstance(vllm, SecurityError) else None,
        "user_after_tool": not (any_id or nine) or _renders(text, [*tool_turn("probe0001"), again], "tool", "again")[0],
        "consecutive_users": _renders(text, [user, again], "user", "again")[0],
    }


def _sys(name: str) -> dict[str, str]:
    return {"role": "system", "content": _S + name}


def _renders(text: str, messages: list[dict], *names: str) -> tuple[bool, str | None]:
    """(every named sentinel shows in the rendering, the template's error if it raised)."""
    out, error = _render(text, messages)
    return out is not None and all(_S + n in out for n in names), error


def _render(text: str, messages: list[dict]) -> tuple[str | None, str | None]:
    """As polar renders: transformers' renderer (vLLM's), or jinja2's sandbox where only that one renders."""
    from transformers.utils.chat_template_utils import render_jinja_template

    try:
        try:
            rendered, _ = render_jinja_template(conversations=[messages], chat_template=text,
                                                add_generation_prompt=True)
        except SecurityError:
            return render_with_own_data(text, messages, None, {}, add_generation_prompt=True), None
    except Exception as exc:  # noqa: BLE001 - raise_exception(), TypeError on list content, undefined attributes
        return None, str(exc) or type(exc).__name__
    return rendered[0], None
