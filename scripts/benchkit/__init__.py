"""The benchmark harness every scripts/bench_*.py stands on, written once:

    targets.py   the processes a benchmark starts and measures (the upstream double, `polar proxy` in each
                 mode, from any tree or with --workers, LiteLLM, plain mitmdump, polar's mitmproxy floors),
                 their CPU and memory from /proc, and the small call each target gets;
    load.py      load: N clients on keep-alive connections, cells of timed calls, targets taking turns, and
                 the CPU each process spent on a cell (the proxy, its main thread, a front, the upstream,
                 the load generator);
    stream.py    streamed load: calls read event by event (time to first answer event, every later arrival);
    replay.py    the six CLIs' recorded requests as sessions growing turn by turn;
    lockstep.py  replayed load: those sessions in lock-step against a target, CPU per turn bucket;
    store.py     the capture store in process: calls written as the gateway writes them, bytes in use;
    report.py    a run's lifecycle (work dir, services stopped last first, host load) and its report
                 (tables of cells against direct, Markdown, the command line, load average and steal);
    args.py      the command-line flags the benchmarks share;
    profile.py   py-spy on a proxy between two marks: where its CPU goes, bucket by bucket.

`python scripts/bench.py NAME [args]` runs scripts/bench_NAME.py.
"""
