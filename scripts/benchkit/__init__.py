"""The benchmark harness every scripts/bench_*.py stands on, written once:

    targets.py  the processes a benchmark starts and measures (the upstream double, `polar proxy` in each
                mode, from any tree or with --workers, LiteLLM, plain mitmdump, polar's mitmproxy floors),
                their CPU from /proc, and the small call each target gets;
    load.py     load: N clients on keep-alive connections, cells of timed calls, targets taking turns;
    report.py   a run's lifecycle (work dir, services stopped last first, host load) and its report
                (tables, Markdown, the command line, load average and the hypervisor's steal);
    args.py     the command-line flags the benchmarks share;
    profile.py  py-spy on a proxy between two marks: where its CPU goes, bucket by bucket.

`python scripts/bench.py NAME [args]` runs scripts/bench_NAME.py.
"""
