"""The upstream backend the gateway samples through, built from the `polar_upstream*`, tokenizer and template
options: vLLM's chat API, or token-faithful prompts over it when a tokenizer is set."""

from __future__ import annotations

from typing import Any

from polar.upstream.vllm_chat import VLLMChat


def token_faithful(chat: VLLMChat, tokenizer_dir: str, template_path: str, endpoint: str):
    from polar.tokens.template import ChatTemplate
    from polar.upstream.vllm_tokens import TokenFaithful

    template = ChatTemplate.from_dir(tokenizer_dir, template_path or None)
    template.prepare_long_text()
    return TokenFaithful(chat, template, endpoint)


def build_backend(opts: Any):
    """`opts`: mitmproxy's options (read by attribute)."""
    backend = VLLMChat(
        opts.polar_upstream,
        model=opts.polar_upstream_model or None,
        api_key=opts.polar_upstream_key or None,
        timeout=opts.polar_upstream_timeout,
        chat_template=opts.polar_chat_template or None,
    )
    if opts.polar_tokenizer:
        backend = token_faithful(backend, opts.polar_tokenizer, opts.polar_chat_template, opts.polar_token_endpoint)
    return backend
