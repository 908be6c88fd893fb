#!/usr/bin/env python3
"""Fuzz a running polar with hostile HTTP requests on keep-alive connections; print outcomes.

Mutated and deeply nested JSON, methods polar does not serve (HEAD included), binary bodies, wrong
content types and unknown paths (tests/support/hostile.py), in all four provider APIs. Without
--url it starts its own stack in this process: the scripted vLLM double and polar, token-faithful.
A client error must never be a 5xx, every error body must be in the caller's provider shape (HEAD:
no body), the connection must stay usable, and every POST must leave a capture row.

    python scripts/fuzz_gateway.py [--requests 10000] [--seed 0] [--connections 2]
                                   [--url http://127.0.0.1:8080 [--db captures.db]]
Exit status 1 when any request saw a problem.
"""

from __future__ import annotations

import argparse
import os
import random
import sqlite3
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from tests.support.hostile import KeepAlive, Outcome, probe

CACHE = Path(os.environ.get("POLAR_CACHE", Path.home() / ".cache" / "polar"))
DEFAULT_TOKENIZER = CACHE / "models" / "qwen35-tiny"


@dataclass
class Report:
    outcomes: list[Outcome] = field(default_factory=list)
    seconds: float = 0.0
    missing_rows: int | None = None  # call ids answered but absent from the capture DB (None: not checked)

    @property
    def problems(self) -> Counter:
        return Counter(problem.split(":")[0] for o in self.outcomes for problem in o.problems)


@contextmanager
def own_stack(tokenizer: Path):
    """The scripted vLLM double and polar in this process (one proxy per process: mitmproxy's rule)."""
    import httpx

    from polar.doubles.scripted_vllm import BackgroundServer, ScriptedVLLM
    from polar.mitm.proxy import BackgroundProxy, ProxyConfig, free_port

    server = BackgroundServer(ScriptedVLLM(tokenizer, "polar-tiny", max_model_len=32768).app)
    upstream = server.start()
    httpx.post(f"{upstream}/_double/script", json={"rules": [{"match": "", "steps": [{"content": "ok"}]}]})
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "captures.db"
        proxy = BackgroundProxy(ProxyConfig(upstream=upstream, db=str(db), port=free_port(), tokenizer=str(tokenizer)))
        proxy.start()
        try:
            yield proxy.url, db
        finally:
            proxy.stop()
            server.stop()


def run(url: str, requests: int, seed: int, connections: int = 1, db: Path | None = None) -> Report:
    """`requests` probes from `Random(seed)`, spread over `connections` keep-alive connections."""
    rng = random.Random(seed)
    session = f"fuzz-{seed}-{time.time_ns() % 10**9}"
    probes = [probe(rng, session) for _ in range(requests)]
    report = Report()

    def worker(share: list) -> None:
        conn = KeepAlive(url)
        report.outcomes.extend(conn.send(p) for p in share)  # list.extend of a generator: one thread's batch
        conn.close()

    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker, args=(probes[i::connections],)) for i in range(connections)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    report.seconds = time.perf_counter() - t0
    if db is not None:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
            stored = {row[0] for row in conn.execute("SELECT call_id FROM calls WHERE session_id = ?", (session,))}
        report.missing_rows = sum(1 for o in report.outcomes if o.call_id and o.call_id not in stored)
    return report


def table(report: Report) -> str:
    """Outcomes by provider API (rows) and HTTP status (columns), then the problems found."""
    statuses = sorted({o.status for o in report.outcomes if o.status is not None})
    apis = sorted({o.probe.api for o in report.outcomes})
    head = ["api"] + [str(s) for s in statuses] + ["no answer", "total"]
    rows = []
    for api in [*apis, "all"]:
        mine = [o for o in report.outcomes if api in ("all", o.probe.api)]
        count = Counter(o.status for o in mine)
        rows.append([api] + [str(count[s]) for s in statuses] + [str(count[None]), str(len(mine))])
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in [head, *rows]]
    kinds = Counter(o.probe.kind for o in report.outcomes)
    lines.append("probes: " + ", ".join(f"{k} {n}" for k, n in sorted(kinds.items())))
    methods = Counter(o.probe.method for o in report.outcomes)
    lines.append("methods: " + ", ".join(f"{k} {n}" for k, n in sorted(methods.items())))
    n = len(report.outcomes)
    lines.append(f"{n} requests in {report.seconds:.1f} s ({n / max(report.seconds, 1e-9):.0f}/s)")
    captured = sum(1 for o in report.outcomes if o.call_id)
    rows_note = "" if report.missing_rows is None else f", {report.missing_rows} without a capture row"
    lines.append(f"captured calls: {captured}{rows_note}")
    problems = report.problems
    lines.append("problems: " + (", ".join(f"{k} {v}" for k, v in problems.most_common()) or "none"))
    for o in [o for o in report.outcomes if o.problems][:5]:
        p = o.probe
        lines.append(f"  e.g. {p.kind} {p.method} {p.path} [{p.api}] → {o.status}: {o.problems} body={p.body[:80]!r}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> Report:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=10_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--connections", type=int, default=1, help="keep-alive connections used side by side")
    ap.add_argument("--url", help="a running polar (default: start one in this process)")
    ap.add_argument("--db", type=Path, help="with --url: its capture DB, to check every call has a row")
    ap.add_argument("--tokenizer", type=Path, default=DEFAULT_TOKENIZER, help="for the in-process stack")
    args = ap.parse_args(argv)
    if args.url:
        report = run(args.url, args.requests, args.seed, args.connections, args.db)
    else:
        with own_stack(args.tokenizer) as (url, db):
            report = run(url, args.requests, args.seed, args.connections, db)
    print(f"command: python scripts/fuzz_gateway.py --requests {args.requests} --seed {args.seed} "
          f"--connections {args.connections}{' --url ' + args.url if args.url else ''}")
    print(table(report))
    return report


if __name__ == "__main__":
    sys.exit(1 if main().problems else 0)
