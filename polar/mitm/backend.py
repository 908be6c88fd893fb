"""The upstream backend the gateway samples through, built from the `polar_upstream*`, fleet, tokenizer and template
options: one vLLM server or a fleet of replicas (polar/upstream/fleet), token-faithful when a tokenizer is set."""

from __future__ import annotations

from typing import Any

from mitmproxy import exceptions

from polar.upstream.fleet.build import upstream_backend
from polar.upstream.fleet.replicas import upstream_urls


def build_backend(opts: Any):
    """`opts`: mitmproxy's options (read by attribute)."""
    try:
        urls = upstream_urls([opts.polar_upstream])
    except ValueError as exc:
        raise exceptions.OptionsError(f"polar_upstream: {exc}") from None
    if not urls:
        raise exceptions.OptionsError("polar_upstream names no upstream")
    return upstream_backend(
        urls, model=opts.polar_upstream_model or None, api_key=opts.polar_upstream_key or None,
        timeout=opts.polar_upstream_timeout, chat_template=opts.polar_chat_template or None,
        tokenizer=opts.polar_tokenizer or None, endpoint=opts.polar_token_endpoint,
        imbalance=opts.polar_fleet_imbalance / 100, stall=opts.polar_upstream_stall,
    )
