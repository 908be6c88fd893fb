#!/usr/bin/env python3
"""Benchmark: latency, throughput and CPU polar adds over calling the upstream directly.

Every column runs against the same upstream (scripts/bench_upstream.py: the scripted vLLM double
behind an answer cache, so the upstream's own cost is small, stable and equal for all), side by
side at each concurrency, from one load generator (this process):
  direct  — the OpenAI chat call with token ids straight to the upstream: exactly what polar itself
            sends upstream for the Anthropic call below (streamed: the same with "stream": true);
  polar   — the same conversation as an Anthropic Messages call through `polar proxy` (detect,
            translate, upstream call, render, durable capture), one process.
Each cell times max(--requests, 4 x clients) requests, in --rounds parts (default 5) that the targets take
turns at, each part after one warm-up request per connection;
CPU is the proxy's (and the upstream's) user+system time over the timed part, from /proc.
On this 2-core machine client, proxy and upstream share the CPU, so absolute numbers are
pessimistic; added latency, ratios and CPU per request are the figures to read.
scripts/bench_peers.py adds the LiteLLM proxy to the same table; both stand on scripts/benchkit/.

    python scripts/bench_proxy.py [--requests 300] [--concurrency 1 16 64 256] [--rounds 5] [--stream both]
                                  [--sync FULL NORMAL] [--markdown]
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchkit import args as cli  # noqa: E402
from benchkit.load import Cell, run_matrix, streams_of  # noqa: E402
from benchkit.report import Run, results_table, target_lines  # noqa: E402
from benchkit.targets import (  # noqa: E402
    check_targets,
    direct_target,
    polar_target,
    reference_targets,
    start_upstream,
    upstream_stats,
)


def main(argv: Sequence[str] | None = None) -> list[Cell]:
    ap = cli.parser(__doc__)
    cli.common_args(ap)
    cli.rounds_arg(ap)
    cli.reference_args(ap)
    argv = list(sys.argv[1:] if argv is None else argv)
    args = ap.parse_args(argv)
    cli.check_args(ap, args)
    with Run("bench_proxy.py", argv) as run:
        upstream = run.start(start_upstream(run.work, args.tokenizer))
        targets = [direct_target(upstream), *reference_targets(run.work, upstream, args, run.services)]
        for sync in args.sync:
            targets.append(run.add(polar_target(run.work, upstream, sync, cli.polar_name(sync, args.sync))))
        check_targets(targets)
        cells = run_matrix(targets, upstream, args.concurrency, streams_of(args.stream), args.requests,
                           run.progress, args.rounds)
        stats = upstream_stats(upstream)
    title = (f"polar vs direct upstream (polar: 1 process, captures synchronous={'/'.join(args.sync)}; "
             f"{os.cpu_count()} cores shared by client, proxy and upstream)")
    run.report(results_table(cells, title), [*target_lines(cells, cli.polar_name(args.sync[0], args.sync)), stats],
               args.markdown)
    return cells


if __name__ == "__main__":
    main()
