"""The mitmproxy addon: hands each HTTP flow to the gateway and answers it from the proxy.

Configured entirely through mitmproxy options (`--set polar_upstream=…`), so `mitmdump -s
addons/polar_gateway.py`, `mitmweb -s …` and `polar proxy` run the very same code. Flows carry
the session, provider and token counts (`flow.metadata["polar"]`, the flow comment) so mitmweb
shows them; its "polar" contentview (polar/mitm/contentview.py) shows a call's capture in full.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from mitmproxy import contentviews, ctx, http

from polar.capture.store import CaptureStore
from polar.mitm.contentview import PolarContentview
from polar.gateway.pipeline import Gateway, GatewayRequest
from polar.sessions.identity import REDACTED, SECRET_HEADERS, SessionRegistry
from polar.upstream.vllm_chat import VLLMChat

log = logging.getLogger("polar.mitm.addon")

_GATEWAY_OPTIONS = {
    "polar_upstream", "polar_upstream_model", "polar_upstream_key", "polar_upstream_timeout",
    "polar_db", "polar_db_sync", "polar_max_body", "polar_model_aliases",
    "polar_tokenizer", "polar_chat_template", "polar_token_endpoint",
}  # fmt: skip


def token_faithful(chat: VLLMChat, tokenizer_dir: str, template_path: str, endpoint: str):
    from polar.tokens.parsers import family_for_template
    from polar.tokens.template import ChatTemplate
    from polar.upstream.vllm_tokens import TokenFaithful

    template = ChatTemplate.from_dir(tokenizer_dir, template_path or None)
    return TokenFaithful(chat, template, family_for_template(template.template_text), endpoint)


class PolarAddon:
    def __init__(self) -> None:
        self.gateway: Gateway | None = None
        self.registry: SessionRegistry | None = None
        self._retired: list = []

    def load(self, loader) -> None:
        contentviews.add(PolarContentview(lambda: self.gateway))  # the "polar" view of each call in mitmweb
        loader.add_option("polar_upstream", str, "http://127.0.0.1:8000", "Base URL of the vLLM server.")
        loader.add_option("polar_upstream_model", str, "", "Served model name at the upstream ('' = ask its /v1/models).")
        loader.add_option("polar_upstream_key", str, "", "API key polar sends to the upstream (never the client's).")
        # int, not float: mitmproxy's `--set` cannot parse float options.
        loader.add_option("polar_upstream_timeout", int, 600, "Seconds to wait for one upstream answer.")
        loader.add_option("polar_db", str, "captures.db", "SQLite file that receives one row per model call.")
        loader.add_option(
            "polar_db_sync", str, "FULL", "SQLite synchronous mode for captures.", choices=["FULL", "NORMAL"]
        )
        loader.add_option("polar_max_body", int, 64 * 1024 * 1024, "Largest request body accepted, in bytes.")
        loader.add_option("polar_model_aliases", Sequence[str], [], "Extra model names listed on GET …/models.")
        loader.add_option(
            "polar_tokenizer", str, "",
            "Hugging Face tokenizer dir of the served model. Set = token-faithful prompts (polar builds the prompt ids, "
            "reusing each session's sampled ids); '' = vLLM renders the chat template.",
        )
        loader.add_option("polar_chat_template", str, "", "Jinja chat template file ('' = the tokenizer's own).")
        loader.add_option(
            "polar_token_endpoint", str, "auto", "Token-in vLLM endpoint.", choices=["auto", "generate", "completions"]
        )

    def configure(self, updated: set[str]) -> None:
        if self.gateway is not None and not (updated & _GATEWAY_OPTIONS):
            return
        opts = ctx.options
        if self.gateway is not None:
            self._retired.append(self.gateway)
        store = CaptureStore(opts.polar_db, synchronous=opts.polar_db_sync)
        if self.registry is None or "polar_db" in updated:
            # Registered keys/addresses outlive a reconfiguration; the salt belongs to the database.
            self.registry = SessionRegistry(salt=store.key_salt())
        interrupted = store.mark_interrupted()
        if interrupted:
            log.warning("marked %d calls from an earlier run as interrupted", interrupted)
        backend = VLLMChat(
            opts.polar_upstream,
            model=opts.polar_upstream_model or None,
            api_key=opts.polar_upstream_key or None,
            timeout=opts.polar_upstream_timeout,
        )
        if opts.polar_tokenizer:
            backend = token_faithful(backend, opts.polar_tokenizer, opts.polar_chat_template, opts.polar_token_endpoint)
        self.gateway = Gateway(store, backend, registry=self.registry, max_body_bytes=opts.polar_max_body,
                               model_aliases=list(opts.polar_model_aliases))

    async def request(self, flow: http.HTTPFlow) -> None:
        if flow.response is not None or self.gateway is None:
            return
        req = flow.request
        try:
            body = req.get_content(strict=False) or b""
        except ValueError:  # undecodable content-encoding: hand over the raw bytes
            body = req.raw_content or b""
        peer = flow.client_conn.peername
        headers = {k.lower(): v for k, v in req.headers.items()}
        headers.setdefault("host", req.host_header or req.pretty_host)  # HTTP/2 carries :authority only
        out = await self.gateway.handle(
            GatewayRequest(
                method=req.method,
                path=req.path.split("?", 1)[0],
                query=dict(req.query),
                headers=headers,
                body=body,
                client_addr=peer[0] if peer else None,
            )
        )
        # The key only identified the session. mitmweb lists flows and can save them: the flow keeps
        # the headers redacted, as the capture store does (polar never sends them upstream).
        for name in SECRET_HEADERS:
            if name in req.headers:
                req.headers[name] = REDACTED
        flow.response = http.Response.make(out.reply.status, out.reply.body, out.reply.headers)
        flow.metadata["polar"] = out.meta
        if "call_id" in out.meta:
            flow.comment = " ".join(
                f"{k}={out.meta[k]}" for k in ("session", "provider", "prompt_tokens", "completion_tokens") if k in out.meta
            )

    async def done(self) -> None:
        for gateway in [*self._retired, self.gateway]:
            if gateway is not None:
                await gateway.backend.aclose()
                gateway.store.close()
