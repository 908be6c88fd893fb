"""Rendering a chat template that changes its own lists, which vLLM's renderer refuses.

transformers renders chat templates (and so does vLLM's chat endpoint, through it) in jinja2's
`ImmutableSandboxedEnvironment`, whose one rule beyond jinja2's `SandboxedEnvironment` is that no
list, dict or set may be changed (`modifies_known_mutable`). Kimi-K2-Instruct's and Kimi-K2-Thinking's
real templates keep a queue of the tool-call ids they wrote (`namespace(ids=[])`, `.append`,
`.pop(0)`) to name each tool result after its call, so once a conversation holds a tool call that
renderer raises a `SecurityError`; llama.cpp's renderer takes them.

In token-faithful mode polar renders the prompt itself and vLLM only samples ids, so polar can render
such a template in jinja2's `SandboxedEnvironment`: every other rule of the sandbox stays (no
underscore attributes, no unsafe callables; transformers' own `namespace`, `dict`, `tojson`,
`raise_exception`, `strftime_now` and block options), and the template only ever changes data made
for this one render: its own lists, or the fresh plain copies of the messages and tools transformers'
`_plain_template_data` makes for every render (never the caller's objects, never the tool copies
tool_json.py shares between renders). It is a fallback, taken only where vLLM's renderer raises the
sandbox's error and this one renders: everywhere vLLM renders, polar's text is vLLM's (the two sandboxes
differ in that one rule, so a render both allow is the same text).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from jinja2.exceptions import SecurityError
from jinja2.sandbox import SandboxedEnvironment

__all__ = ["SecurityError", "render_with_own_data", "vllm_render_error"]

_lock = threading.Lock()
_compiled: dict[str, Any] = {}  # template text -> its template in the mutable sandbox
_KEPT = 64  # template texts (a process serves one or a few)


def _compile(text: str) -> Any:
    """The template in jinja2's SandboxedEnvironment, set up as transformers sets up its immutable one."""
    from transformers.utils.chat_template_utils import _compile_jinja_template

    with _lock:
        if text in _compiled:
            return _compiled[text]
        base = _compile_jinja_template(text).environment  # transformers' (vLLM's) environment for this text
        env = SandboxedEnvironment(trim_blocks=base.trim_blocks, lstrip_blocks=base.lstrip_blocks,
                                   extensions=[type(ext) for ext in base.extensions.values()])
        env.filters.update(base.filters)
        env.tests.update(base.tests)
        env.globals.update(base.globals)
        if len(_compiled) >= _KEPT:
            _compiled.clear()
        _compiled[text] = env.from_string(text)
        return _compiled[text]


def render_with_own_data(text: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                         special_tokens: Mapping[str, Any], **kwargs: Any) -> str:
    """What `tokenizer.apply_chat_template(messages, tools=tools, chat_template=text, tokenize=False, **kwargs)`
    renders, in the sandbox that lets the template change its own lists (tests/tokens/test_own_data_sandbox.py
    holds the two equal wherever transformers renders)."""
    import transformers.utils.chat_template_utils as chat_utils

    plain = chat_utils._plain_template_data
    chat = [{k: v for k, v in m.items() if v is not None} for m in messages]  # as apply_chat_template drops None
    chat = chat_utils._alias_reasoning_fields(plain(chat))
    schemas = plain([dict(tool) for tool in tools]) if tools is not None else None  # fresh copies, never shared
    values = plain({**special_tokens, **kwargs})
    return _compile(text).render(messages=chat, tools=schemas, documents=None, **values)


def vllm_render_error(text: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                      **kwargs: Any) -> Exception | None:
    """What transformers' renderer (vLLM's chat endpoint's) raises on these messages (None: it renders)."""
    from transformers.utils.chat_template_utils import render_jinja_template

    try:
        render_jinja_template(conversations=[messages], tools=tools, chat_template=text, **kwargs)
    except Exception as exc:  # noqa: BLE001 - a sandbox SecurityError, raise_exception(), undefined attributes
        return exc
    return None
