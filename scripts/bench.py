#!/usr/bin/env python3
"""One entry point for the benchmarks: `python scripts/bench.py NAME [args]` runs scripts/bench_NAME.py with args.

    python scripts/bench.py --list          # the benchmarks
    python scripts/bench.py peers --help    # a benchmark's flags (docs/benchmarks.md: what each measures)

`upstream` (the scripted vLLM double) and `floor_proxy` (polar's mitmproxy with a one-job addon) are the servers
the others start (scripts/benchkit/targets.py); run alone, they serve until stopped.
"""

from __future__ import annotations

import ast
import runpy
import sys
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parent


def benchmarks() -> dict[str, Path]:
    return {p.stem.removeprefix("bench_"): p for p in sorted(SCRIPTS.glob("bench_*.py"))}


def summary(script: Path) -> str:
    """The first line of a benchmark's docstring, without its "Benchmark: " (read, not imported)."""
    doc = ast.get_docstring(ast.parse(script.read_text())) or ""
    return doc.partition("\n")[0].removeprefix("Benchmark: ")


def usage(known: dict[str, Path]) -> str:
    width = max(map(len, known))
    return "\n".join([__doc__.strip(), "", "benchmarks:", *(f"  {name:<{width}}  {summary(path)}" for name, path in known.items())])


def main(argv: list[str]) -> int:
    known = benchmarks()
    if not argv or argv[0] in ("-h", "--help", "--list"):
        print(usage(known) if not argv or argv[0] != "--list" else "\n".join(known))
        return 0
    name, rest = argv[0].removeprefix("bench_").removesuffix(".py"), argv[1:]
    if name not in known:
        print(f"bench.py: no benchmark {argv[0]!r}; one of: {', '.join(known)}", file=sys.stderr)
        return 2
    sys.argv = [str(known[name]), *rest]
    sys.path.insert(0, str(SCRIPTS))
    runpy.run_path(str(known[name]), run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
