#!/usr/bin/env python3
"""Benchmark: polar against a peer proxy doing the same Anthropic → OpenAI translation, and direct.

All columns run against one upstream (scripts/bench_upstream.py: the scripted vLLM double behind an
answer cache, streaming when asked), side by side at each concurrency, from one load generator:
  direct   — the OpenAI chat call straight to the upstream: what polar sends it for the call below;
  polar    — an Anthropic Messages call through `polar proxy` (one process; durable capture);
  litellm  — the same Anthropic call through the LiteLLM proxy's /v1/messages, configured with the
             upstream as a `hosted_vllm` model (chat completions) asking for the same token ids and
             logprobs polar asks for, so the upstream returns identical bytes; one uvicorn worker
             (--num_workers 1), no database, its default logging. Install it with
             scripts/setup_litellm.sh (its own venv). --litellm-plain adds a second one that
             asks for neither (LiteLLM's default; the upstream then sends a smaller answer).
Streamed, every target reads the upstream's token-by-token stream: polar relays it in the client's
format as it arrives and commits the capture once it has ended.
The measurement itself (load, percentiles, CPU from /proc) is scripts/bench_proxy.py's.

    python scripts/bench_peers.py [--requests 300] [--concurrency 1 16 64 256] [--stream both]
                                  [--sync FULL] [--no-litellm | --litellm-plain] [--markdown]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_proxy as core  # noqa: E402  (the measurement core)

DEFAULT_LITELLM = core.CACHE / "litellm-venv" / "bin" / "litellm"


def litellm_config(upstream_url: str, token_ids: bool = True, extra_body: dict | None = None,
                   names: Sequence[str] = (core.ANTHROPIC_BODY["model"],), extra_params: dict | None = None) -> dict:
    """The LiteLLM proxy's model list: each model name (default: the Anthropic one) served by the upstream's
    chat endpoint (`extra_body`: more fields for every upstream request; `extra_params`: more litellm_params)."""
    params = {**(extra_params or {}), "model": f"hosted_vllm/{core.DIRECT_BODY['model']}", "api_base": f"{upstream_url}/v1", "api_key": "bench"}
    if token_ids:  # what polar asks vLLM for as well: the upstream does the same work and sends the same bytes
        params["extra_body"] = {"return_token_ids": True, "logprobs": True}
    if extra_body:
        params["extra_body"] = {**params.get("extra_body", {}), **extra_body}
    return {"model_list": [{"model_name": name, "litellm_params": params} for name in names]}


def start_litellm(workdir: Path, upstream: core.Service, executable: Path, token_ids: bool = True,
                  extra_body: dict | None = None, names: Sequence[str] = (core.ANTHROPIC_BODY["model"],),
                  extra_params: dict | None = None) -> core.Service:
    name = "litellm" if token_ids else "litellm-plain"
    config = workdir / f"{name}.yaml"
    settings = litellm_config(core.upstream_url(upstream), token_ids, extra_body, names, extra_params)
    config.write_text(json.dumps(settings, indent=2))  # JSON is YAML
    port = core.free_port()
    cmd = [str(executable), "--config", str(config), "--host", "127.0.0.1", "--port", str(port), "--num_workers", "1",
           "--telemetry", "False"]
    # The bundled cost map instead of fetching one at start-up (no network here); errors only in its log.
    env = {"LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_LOG": "ERROR"}
    return core.Service(name, cmd, f"http://127.0.0.1:{port}/health/liveliness", workdir / f"{name}.log",
                        env=env, cwd=workdir).start(timeout=180)


def litellm_target(workdir: Path, upstream: core.Service, executable: Path, token_ids: bool = True) -> core.Target:
    proxy = start_litellm(workdir, upstream, executable, token_ids)
    url = f"{proxy.health_url.removesuffix('/health/liveliness')}/v1/messages"
    return core.Target(proxy.name, url, core.ANTHROPIC_BODY, core.ANTHROPIC_HEADERS, proxy)


def main(argv: Sequence[str] | None = None) -> list:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    core.common_args(ap)
    core.rounds_arg(ap)
    core.reference_args(ap)
    ap.add_argument("--litellm", default=str(DEFAULT_LITELLM), help="the LiteLLM proxy's `litellm` executable")
    which = ap.add_mutually_exclusive_group()
    which.add_argument("--no-litellm", action="store_true", help="leave LiteLLM out (direct and polar only)")
    which.add_argument("--litellm-plain", action="store_true",
                       help="also a second LiteLLM, `litellm-plain`, asking the upstream for no token ids or "
                            "logprobs (LiteLLM's own default; polar always needs them)")
    argv = list(sys.argv[1:] if argv is None else argv)
    args = ap.parse_args(argv)
    core.check_args(ap, args)
    if not args.no_litellm and not os.access(args.litellm, os.X_OK):
        ap.error(f"no LiteLLM proxy at {args.litellm}: run scripts/setup_litellm.sh (or pass --no-litellm)")

    console, started, load_before = Console(width=240), time.perf_counter(), core.loadavg()
    services: list[core.Service] = []
    polar_names = [core.polar_name(sync, args.sync) for sync in args.sync]
    with tempfile.TemporaryDirectory(prefix="polar-bench-peers-") as tmp:
        work = Path(tmp)
        try:
            upstream = core.start_upstream(work, args.tokenizer)
            services.append(upstream)
            targets = [core.direct_target(upstream), *core.reference_targets(work, upstream, args, services)]
            for sync, name in zip(args.sync, polar_names, strict=True):
                targets.append(core.polar_target(work, upstream, sync, name))
                services.append(targets[-1].proxy)
            token_id_variants = [] if args.no_litellm else [True] + ([False] if args.litellm_plain else [])
            for token_ids in token_id_variants:
                targets.append(litellm_target(work, upstream, Path(args.litellm), token_ids))
                services.append(targets[-1].proxy)
            core.check_targets(targets)
            cells = core.run_matrix(targets, upstream, args.concurrency, core.streams_of(args.stream), args.requests,
                                    lambda line: console.print(f"[dim]{line}[/dim]"), args.rounds)
            stats = core.upstream_stats(upstream)
        finally:
            for service in reversed(services):
                service.stop()
    peers = "polar" + ("" if args.no_litellm else " and LiteLLM")
    title = (f"{peers} vs direct upstream (1 process each: polar = mitmproxy + addon, captures synchronous="
             f"{'/'.join(args.sync)}; LiteLLM = --num_workers 1; {os.cpu_count()} cores shared by client, "
             "proxies and upstream)")
    lines = core.target_lines(cells, polar_names[0], None if args.no_litellm else "litellm")
    core.print_report(console, core.results_table(cells, title), [*lines, stats], args.markdown, load_before,
                      started, core.command_line("bench_peers.py", argv))
    return cells


if __name__ == "__main__":
    main()
