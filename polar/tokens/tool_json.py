"""The tools a chat template renders, prepared once per tool instead of on every render.

A token-faithful continuation renders the new messages after the system prompt, and the system prompt
carries the tools; Claude Code sends 12 on every call. transformers' `apply_chat_template` (what vLLM
renders with) rebuilds every value it hands a template out of plain JSON types on each render
(`_plain_template_data`, its sandbox hardening), and the template writes each tool with its `tojson`
filter: ~0.8 ms a call, the same work on the same tools every time.

Here a canonical tool becomes one `ToolDict` (`tool_dict`, per tool object; never modified), whose plain
copy transformers' own function makes once and hands back on later renders; what the template's own
`tojson` filter writes for that copy is kept with it. Any other value takes transformers' path as before.
The copies are plain data behind Jinja's immutable sandbox, so sharing them between renders changes
nothing a template can see (tests/tokens/test_tool_json.py: every reference template renders the same
with and without this). If transformers no longer has the function, nothing is wrapped.
"""

from __future__ import annotations

import threading
from typing import Any

from polar.canonical import Tool
from polar.object_memo import ObjectMemo
from polar.tokens.messages import to_openai_tools


class ToolDict(dict):
    """An OpenAI tool dict made once per canonical tool and never modified (the tool's values aren't either)."""


KEPT = 4096  # tools (a session's are read once: ~12 a session); then all are let go and made again

tool_dict: ObjectMemo[ToolDict] = ObjectMemo(lambda tool: ToolDict(to_openai_tools([tool])[0]), KEPT)


def openai_tool(tool: Tool | dict[str, Any]) -> dict[str, Any]:
    """The dict a template renders for a tool: a canonical tool's made once; a dict as given."""
    return tool_dict(tool) if isinstance(tool, Tool) else tool


_lock = threading.Lock()
_plain: ObjectMemo[Any] | None = None  # ToolDict -> transformers' plain copy of it
_json: dict[int, tuple[Any, dict[tuple, str]]] = {}  # id(plain copy) -> (the copy, tojson's texts by arguments)


def install(template_text: str) -> None:
    """Once per process: transformers' plain copy kept per ToolDict. Once per template text: the `tojson`
    filter of transformers' compiled template for it (the very object `apply_chat_template` renders with; it
    caches one per text) keeps what it writes for those copies."""
    global _plain
    import transformers.utils.chat_template_utils as chat_utils

    with _lock:
        original = getattr(chat_utils, "_plain_template_data", None)
        compile_template = getattr(chat_utils, "_compile_jinja_template", None)
        if original is None or compile_template is None:
            return
        if _plain is None and not getattr(original, "polar", False):
            _plain = ObjectMemo(_copy_once(original), KEPT)

            def plain_template_data(value: Any) -> Any:
                if type(value) is ToolDict:
                    return _plain(value)
                return original(value)

            plain_template_data.polar = True  # type: ignore[attr-defined]
            chat_utils._plain_template_data = plain_template_data
        _wrap_tojson(compile_template(template_text))


def _copy_once(original: Any):
    def copy(tool: ToolDict) -> Any:
        out = original(dict(tool))
        if len(_json) >= KEPT:
            _json.clear()  # the copies still kept are then written by tojson as any other value
        _json[id(out)] = (out, {})
        return out
    return copy


def _wrap_tojson(compiled_template: Any) -> None:
    filters = compiled_template.environment.filters
    write = filters.get("tojson")
    if write is None or getattr(write, "polar", False):
        return

    def tojson(value: Any, *args: Any, **kwargs: Any) -> str:
        kept = _json.get(id(value))
        if kept is None or kept[0] is not value:
            return write(value, *args, **kwargs)
        key = (args, tuple(sorted(kwargs.items())))
        text = kept[1].get(key)
        if text is None:
            text = kept[1][key] = write(value, *args, **kwargs)
        return text

    tojson.polar = True  # type: ignore[attr-defined]
    filters["tojson"] = tojson
