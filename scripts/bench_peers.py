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
The measurement itself (load, percentiles, CPU from /proc) is scripts/benchkit/'s, as bench_proxy.py's is.

    python scripts/bench_peers.py [--requests 300] [--concurrency 1 16 64 256] [--stream both]
                                  [--sync FULL] [--no-litellm | --litellm-plain] [--markdown]
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchkit import args as cli  # noqa: E402
from benchkit.load import run_matrix, streams_of  # noqa: E402
from benchkit.report import Run, results_table, target_lines  # noqa: E402
from benchkit.targets import (  # noqa: E402
    check_targets,
    direct_target,
    litellm_target,
    polar_target,
    reference_targets,
    start_upstream,
    upstream_stats,
)


def main(argv: Sequence[str] | None = None) -> list:
    ap = cli.parser(__doc__)
    cli.common_args(ap)
    cli.rounds_arg(ap)
    cli.reference_args(ap)
    which = cli.litellm_args(ap)
    which.add_argument("--litellm-plain", action="store_true",
                       help="also a second LiteLLM, `litellm-plain`, asking the upstream for no token ids or "
                            "logprobs (LiteLLM's own default; polar always needs them)")
    argv = list(sys.argv[1:] if argv is None else argv)
    args = ap.parse_args(argv)
    cli.check_args(ap, args)
    cli.check_litellm(ap, args)

    polar_names = [cli.polar_name(sync, args.sync) for sync in args.sync]
    with Run("bench_peers.py", argv) as run:
        upstream = run.start(start_upstream(run.work, args.tokenizer))
        targets = [direct_target(upstream), *reference_targets(run.work, upstream, args, run.services)]
        for sync, name in zip(args.sync, polar_names, strict=True):
            targets.append(run.add(polar_target(run.work, upstream, sync, name)))
        token_id_variants = [] if args.no_litellm else [True] + ([False] if args.litellm_plain else [])
        for token_ids in token_id_variants:
            targets.append(run.add(litellm_target(run.work, upstream, Path(args.litellm), token_ids)))
        check_targets(targets)
        cells = run_matrix(targets, upstream, args.concurrency, streams_of(args.stream), args.requests, run.progress,
                           args.rounds)
        stats = upstream_stats(upstream)
    peers = "polar" + ("" if args.no_litellm else " and LiteLLM")
    title = (f"{peers} vs direct upstream (1 process each: polar = mitmproxy + addon, captures synchronous="
             f"{'/'.join(args.sync)}; LiteLLM = --num_workers 1; {os.cpu_count()} cores shared by client, "
             "proxies and upstream)")
    lines = target_lines(cells, polar_names[0], None if args.no_litellm else "litellm")
    run.report(results_table(cells, title), [*lines, stats], args.markdown)
    return cells


if __name__ == "__main__":
    main()
