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
scripts/bench_peers.py adds the LiteLLM proxy to the same table; this module is its measurement core.

    python scripts/bench_proxy.py [--requests 300] [--concurrency 1 16 64 256] [--rounds 5] [--stream both]
                                  [--sync FULL NORMAL] [--markdown]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import httpx
from rich import box
from rich.console import Console
from rich.table import Table

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from polar.mitm.proxy import die_with_parent, free_port  # noqa: E402

CACHE = Path(os.environ.get("POLAR_CACHE", Path.home() / ".cache" / "polar"))
DEFAULT_TOKENIZER = CACHE / "models" / "qwen35-tiny"
MESSAGES = [{"role": "user", "content": "Say hello in one short sentence."}]
ANTHROPIC_BODY = {"model": "claude-sonnet-4-5", "max_tokens": 64, "messages": MESSAGES}
ANTHROPIC_HEADERS = {"x-api-key": "bench", "anthropic-version": "2023-06-01", "content-type": "application/json"}
# What polar sends upstream for ANTHROPIC_BODY in chat-template mode: the fair "direct" call.
DIRECT_BODY = {"model": "polar-tiny", "messages": MESSAGES, "max_tokens": 64, "return_token_ids": True,
               "logprobs": True}
CLK_TCK = os.sysconf("SC_CLK_TCK")


# -- processes ------------------------------------------------------------------------------------


def children(pid: int) -> list[int]:
    """The process's direct children (those of every thread)."""
    out: list[int] = []
    for listing in Path(f"/proc/{pid}/task").glob("*/children"):
        try:
            out += [int(k) for k in listing.read_text().split()]
        except OSError:  # the thread or process is gone
            continue
    return out


def _descendants(pid: int) -> list[int]:
    out: list[int] = []
    for kid in children(pid):
        out += [kid, *_descendants(kid)]
    return out


def _stat_ticks(stat_file: str) -> int:
    """utime + stime from a /proc stat file (0 when the process or thread is gone)."""
    try:
        stat = Path(stat_file).read_text()
    except OSError:
        return 0
    fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) ": state is field 0
    return int(fields[11]) + int(fields[12])


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process and its live descendants (from /proc, in seconds)."""
    return sum(_stat_ticks(f"/proc/{p}/stat") for p in [pid, *_descendants(pid)]) / CLK_TCK


def main_thread_cpu_seconds(pid: int) -> float:
    """CPU time of the process's main thread alone: for polar and mitmdump, the event loop (mitmproxy's
    layers and hooks, and the addon); the rest of the process is its other threads (polar's capture writer)."""
    return _stat_ticks(f"/proc/{pid}/task/{pid}/stat") / CLK_TCK


class Service:
    """A server started as a child process: output in a log file, up when its health URL answers."""

    def __init__(self, name: str, cmd: Sequence[str], health_url: str, log: Path,
                 env: dict[str, str] | None = None, cwd: Path | None = None):
        self.name, self.cmd, self.health_url, self.log = name, list(cmd), health_url, log
        self.env, self.cwd = env, cwd
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 120) -> Service:
        with open(self.log, "wb") as out:
            # A benchmark killed outright (kill -9, a CI timeout) takes its servers with it.
            self.proc = subprocess.Popen(self.cmd, stdout=out, stderr=subprocess.STDOUT, cwd=self.cwd,
                                         env={**os.environ, **(self.env or {})}, preexec_fn=die_with_parent)
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode} while starting:\n{self.tail()}")
            try:
                if httpx.get(self.health_url, timeout=2).status_code < 500:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"{self.name} did not answer {self.health_url} within {timeout:.0f} s:\n{self.tail()}")

    def tail(self, lines: int = 30) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def cpu_seconds(self) -> float:
        return cpu_seconds(self.proc.pid) if self.proc else 0.0

    def main_thread_cpu_seconds(self) -> float:
        return main_thread_cpu_seconds(self.proc.pid) if self.proc else 0.0

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=30)


def start_upstream(workdir: Path, tokenizer: str | Path, extra: Sequence[str] = ()) -> Service:
    """scripts/bench_upstream.py (`extra`: more of its options, e.g. its streams' pace)."""
    port = free_port()
    cmd = [sys.executable, str(REPO / "scripts" / "bench_upstream.py"), "--port", str(port),
           "--tokenizer", str(tokenizer), *extra]
    return Service("upstream", cmd, f"http://127.0.0.1:{port}/health", workdir / "upstream.log",
                   env={"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}).start()


def upstream_url(upstream: Service) -> str:
    return upstream.health_url.removesuffix("/health")


def start_polar(workdir: Path, upstream: Service, sync: str, tokenizer: str | Path | None = None) -> Service:
    """`polar proxy` in chat-template mode (token-faithful with a tokenizer), captures in its own database
    with this commit mode."""
    port = free_port()
    tag = sync.lower() + ("-tokens" if tokenizer else "")
    cmd = [sys.executable, "-m", "polar.cli", "proxy", "--upstream", upstream_url(upstream), "--port", str(port),
           "--db", str(workdir / f"captures-{tag}.db"), "--set", f"polar_db_sync={sync}"]
    if tokenizer:
        cmd += ["--tokenizer", str(tokenizer)]
    return Service(f"polar (sync={sync}{', token-faithful' if tokenizer else ''})", cmd, f"http://127.0.0.1:{port}/",
                   workdir / f"polar-{tag}.log", env={"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"},
                   cwd=REPO).start()


# -- targets and load -----------------------------------------------------------------------------


@dataclass
class Target:
    """Where the load goes: an endpoint, the request it gets, and the proxy process (None: direct)."""

    name: str
    url: str
    body: dict[str, Any]
    headers: dict[str, str]
    proxy: Service | None = None
    session_per_client: bool = False  # client i's calls name session bench-i (`/s/bench-i/` base URL)

    def request(self, stream: bool) -> dict[str, Any]:
        return {**self.body, "stream": True} if stream else self.body

    def url_for(self, client: int) -> str:
        if not self.session_per_client:
            return self.url
        scheme, _, rest = self.url.partition("://")
        host, _, path = rest.partition("/")
        return f"{scheme}://{host}/s/bench-{client}/{path}"


def direct_target(upstream: Service) -> Target:
    return Target("direct", f"{upstream_url(upstream)}/v1/chat/completions", DIRECT_BODY,
                  {"content-type": "application/json"})


def mitmdump_target(workdir: Path, upstream: Service) -> Target:
    """mitmproxy alone: `mitmdump` as a plain reverse proxy to the upstream, no addon script, direct's
    request through it — the floor under polar, which is mitmproxy plus its addon (what polar adds beyond
    this is polar's own work: detect, translate, session, capture)."""
    port = free_port()
    cmd = [str(Path(sys.executable).with_name("mitmdump")), "--mode", f"reverse:{upstream_url(upstream)}",
           "--listen-host", "127.0.0.1", "--listen-port", str(port), "--quiet"]
    proxy = Service("mitmdump", cmd, f"http://127.0.0.1:{port}/health", workdir / "mitmdump.log").start()
    base = proxy.health_url.removesuffix("/health")
    return Target("mitmdump", f"{base}/v1/chat/completions", DIRECT_BODY, {"content-type": "application/json"},
                  proxy)


FLOOR_TARGETS = {"answer": "mitm answers", "relay": "mitm relay"}


def floor_target(workdir: Path, upstream: Service, mode: str) -> Target:
    """mitmproxy as polar runs it (its lean master) with a one-job addon in polar's place
    (scripts/bench_floor_proxy.py): `answer` answers from memory, `relay` sends direct's request on to the
    upstream over polar's own upstream client (polar/upstream/h1.py) — what polar's path costs before polar's
    own work."""
    port = free_port()
    cmd = [sys.executable, str(REPO / "scripts" / "bench_floor_proxy.py"), "--port", str(port),
           "--upstream", upstream_url(upstream), "--mode", mode]
    name = FLOOR_TARGETS[mode]
    proxy = Service(name, cmd, f"http://127.0.0.1:{port}/health", workdir / f"floor-{mode}.log").start()
    return Target(name, f"http://127.0.0.1:{port}/v1/chat/completions", DIRECT_BODY,
                  {"content-type": "application/json"}, proxy)


def reference_targets(workdir: Path, upstream: Service, args: argparse.Namespace,
                      services: list[Service]) -> list[Target]:
    """The proxies measured beside polar as its floors (`--mitmdump`, `--floor`), each added to `services`
    as it starts (for the caller to stop)."""
    targets: list[Target] = []

    def started(target: Target) -> None:
        targets.append(target)
        services.append(target.proxy)

    if args.mitmdump:
        started(mitmdump_target(workdir, upstream))
    for mode in FLOOR_TARGETS if args.floor else ():
        started(floor_target(workdir, upstream, mode))
    return targets


def polar_target(workdir: Path, upstream: Service, sync: str, name: str = "polar") -> Target:
    proxy = start_polar(workdir, upstream, sync)
    return Target(name, f"{proxy.health_url}v1/messages", ANTHROPIC_BODY, ANTHROPIC_HEADERS, proxy)


def answer_text(target: Target) -> str:
    """One non-streamed call's answer text: proves the target is wired to the upstream before timing it."""
    resp = httpx.post(target.url, json=target.request(False), headers=target.headers, timeout=120)
    if resp.status_code != 200:
        raise RuntimeError(f"{target.name} answered HTTP {resp.status_code}: {resp.text[:500]}")
    body = resp.json()
    if "choices" in body:  # OpenAI chat
        return body["choices"][0]["message"]["content"]
    return "".join(part.get("text", "") for part in body.get("content", []))  # Anthropic Messages


def check_targets(targets: list[Target]) -> None:
    """Every target must give the answer direct gives (the same upstream answer, translated; polar leaves out the
    template's newlines after </think> that vLLM's answer keeps)."""
    want = answer_text(targets[0]).strip("\n")
    for target in targets[1:]:
        got = answer_text(target).strip("\n")
        if got != want:
            raise RuntimeError(f"{target.name} answered {got!r}, direct answered {want!r}")


def upstream_stats(upstream: Service) -> str:
    stats = httpx.get(f"{upstream_url(upstream)}/_bench/stats", timeout=10).json()
    return (f"upstream: {stats['calls']} calls, {stats['misses']} computed by the double "
            f"({len(stats['bodies'])} distinct request {'body' if len(stats['bodies']) == 1 else 'bodies'}), "
            "the rest served from its answer cache")


def percentile(values: Sequence[float], q: int) -> float:
    """The q-th percentile (inclusive method; NaN for no values)."""
    if not values:
        return float("nan")
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


@dataclass
class Cell:
    """One target at one concurrency, streamed or not."""

    target: str
    stream: bool
    clients: int
    latencies: list[float]
    errors: list[str]
    wall: float
    proxy_cpu: float | None  # seconds over the timed part (None: no proxy)
    upstream_cpu: float
    main_thread_cpu: float | None = None  # of proxy_cpu, the proxy's main thread (its event loop)

    @property
    def ok(self) -> int:
        return len(self.latencies)

    def pct(self, q: int) -> float:
        """The q-th percentile latency in ms."""
        return percentile(self.latencies, q) * 1000

    @property
    def rps(self) -> float:
        return self.ok / self.wall if self.wall else 0.0

    def cpu_ms(self, seconds: float | None) -> float | None:
        return None if seconds is None or not self.ok else seconds * 1000 / self.ok


async def drive(target: Target, stream: bool, clients: int, n: int,
                on_start: Callable[[], None]) -> tuple[list[float], list[str], float]:
    """`n` requests from `clients` concurrent clients, one keep-alive connection each."""
    body, latencies, errors = target.request(stream), [], []
    connector = aiohttp.TCPConnector(limit=clients, force_close=False)
    timeout = aiohttp.ClientTimeout(total=300)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def once(client: int) -> None:
            t = time.perf_counter()
            try:
                async with session.post(target.url_for(client), json=body, headers=target.headers) as resp:
                    await resp.read()  # streamed: every event, to the end
                    if resp.status != 200:
                        errors.append(f"HTTP {resp.status}")
                        return
            except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                errors.append(type(exc).__name__)
                return
            latencies.append(time.perf_counter() - t)

        await asyncio.gather(*(once(i) for i in range(clients)))  # open every connection, warm caches
        if errors:
            raise RuntimeError(f"{target.name}: warm-up failed ({errors[0]}; {len(errors)}/{clients} requests)")
        latencies.clear()
        todo = iter(range(n))

        async def client(i: int) -> None:
            for _ in todo:
                await once(i)

        on_start()
        t0 = time.perf_counter()
        await asyncio.gather(*(client(i) for i in range(clients)))
        wall = time.perf_counter() - t0
    return latencies, errors, wall


def measure(target: Target, upstream: Service, stream: bool, clients: int, n: int) -> Cell:
    marks: dict[str, float] = {}

    def start() -> None:
        marks["proxy"] = target.proxy.cpu_seconds() if target.proxy else 0.0
        marks["main_thread"] = target.proxy.main_thread_cpu_seconds() if target.proxy else 0.0
        marks["upstream"] = upstream.cpu_seconds()

    latencies, errors, wall = asyncio.run(drive(target, stream, clients, n, start))
    proxy_cpu = target.proxy.cpu_seconds() - marks["proxy"] if target.proxy else None
    main_thread_cpu = target.proxy.main_thread_cpu_seconds() - marks["main_thread"] if target.proxy else None
    return Cell(target.name, stream, clients, latencies, errors, wall, proxy_cpu,
                upstream.cpu_seconds() - marks["upstream"], main_thread_cpu)


def cell_requests(requests: int, clients: int) -> int:
    return max(requests, 4 * clients)


def run_matrix(targets: list[Target], upstream: Service, concurrency: list[int], streams: list[bool],
               requests: int, progress: Callable[[str], None] = lambda _: None, rounds: int = 1) -> list[Cell]:
    """Every target at every concurrency, targets side by side (so a load spike hits them alike): each cell's
    requests in `rounds` parts, the targets taking turns part by part, so a burst of the host's other
    tenants (a shared VM's steal comes and goes by the minute) falls on every target alike, not on one."""
    cells = []
    for stream in streams:
        for clients in concurrency:
            n = cell_requests(requests, clients)
            parts = max(1, min(rounds, n // (2 * clients)))  # each part at least two calls a client
            done: dict[str, list[Cell]] = {t.name: [] for t in targets}
            for part in range(parts):
                for target in targets:
                    done[target.name].append(measure(target, upstream, stream, clients, n // parts + (part < n % parts)))
            for target in targets:
                cell = merged(done[target.name])
                progress(f"{'streamed' if stream else 'non-streamed'} {clients:>3} clients {target.name:<14} "
                         f"p50 {cell.pct(50):8.2f} ms  {cell.rps:7.1f} req/s  errors {len(cell.errors)}")
                cells.append(cell)
    return cells


def merged(parts: list[Cell]) -> Cell:
    """One cell from the parts a target's requests were measured in: every latency, the time and CPU summed."""
    if len(parts) == 1:
        return parts[0]

    def total(values: list[float | None]) -> float | None:
        return None if any(v is None for v in values) else sum(values)  # type: ignore[arg-type]

    first = parts[0]
    return Cell(first.target, first.stream, first.clients, [x for p in parts for x in p.latencies],
                [e for p in parts for e in p.errors], sum(p.wall for p in parts), total([p.proxy_cpu for p in parts]),
                sum(p.upstream_cpu for p in parts), total([p.main_thread_cpu for p in parts]))


# -- report ---------------------------------------------------------------------------------------


def _ms(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}"


def results_table(cells: list[Cell], title: str) -> Table:
    """One row per target and concurrency; `added` and ratios against direct at the same point."""
    table = Table(title=title)
    for col in ("stream", "clients", "target", "requests", "errors", "p50 ms", "p99 ms", "added p50 ms",
                "added p99 ms", "req/s", "req/s vs direct", "proxy CPU ms/req", "· main thread",
                "upstream CPU ms/req"):
        table.add_column(col, justify="left" if col in ("stream", "target") else "right")
    direct = {(c.stream, c.clients): c for c in cells if c.target == "direct"}
    for c in cells:
        base = direct.get((c.stream, c.clients))
        is_base = base is None or base is c
        table.add_row(
            "yes" if c.stream else "no", str(c.clients), c.target, str(c.ok + len(c.errors)), str(len(c.errors)),
            _ms(c.pct(50)), _ms(c.pct(99)),
            "–" if is_base else _ms(c.pct(50) - base.pct(50)), "–" if is_base else _ms(c.pct(99) - base.pct(99)),
            f"{c.rps:.0f}", "–" if is_base else f"{c.rps / base.rps:.2f}" if base.rps else "–",
            _ms(c.cpu_ms(c.proxy_cpu)), _ms(c.cpu_ms(c.main_thread_cpu)), _ms(c.cpu_ms(c.upstream_cpu)),
        )
    return table


def target_lines(cells: list[Cell], polar: str = "polar", peer: str | None = None) -> list[str]:
    """Issue 15's small-call targets (<= 3 ms added p50 at one client, >= 2x the peer's requests/s at 64),
    read off the cells that were measured; the added latency also as a ratio to the peer's, which a slower
    or faster host moves less than the milliseconds."""
    by = {(c.target, c.stream, c.clients): c for c in cells}
    lines = []
    p, d = by.get((polar, False, 1)), by.get(("direct", False, 1))
    if p and d:
        added = p.pct(50) - d.pct(50)
        q = by.get((peer, False, 1)) if peer else None
        versus = f" ({added / (q.pct(50) - d.pct(50)):.2f}x what {peer} adds)" if q and q.pct(50) > d.pct(50) else ""
        lines.append(f"target: {polar} adds <= 3 ms p50 at 1 client (non-streamed): {added:.2f} ms{versus} — "
                     f"{'met' if added <= 3 else 'NOT met'}")
        if (m := by.get(("mitmdump", False, 1))) is not None:
            lines.append(f"mitmdump (reverse proxy, its default addons, no script) adds {m.pct(50) - d.pct(50):.2f} "
                         "ms p50 at 1 client")
        answer, relay = (by.get((FLOOR_TARGETS[mode], False, 1)) for mode in ("answer", "relay"))
        if answer is not None and relay is not None:
            lean, hop = answer.pct(50) - d.pct(50), relay.pct(50) - d.pct(50)
            lines.append(f"floor: polar's mitmproxy answering from memory adds {lean:.2f} ms p50 at 1 client, relaying "
                         f"to the upstream over polar's client {hop:.2f} ms; polar's own work (detect, translate, session, "
                         f"capture) {added - hop:.2f} ms on top")
    if peer:
        for stream in (False, True):
            p, q = by.get((polar, stream, 64)), by.get((peer, stream, 64))
            if p and q:
                lines.append(f"target: {polar} serves >= 2x {peer}'s requests/s at 64 clients "
                             f"({'streamed' if stream else 'non-streamed'}): {p.rps:.0f} vs {q.rps:.0f} req/s, "
                             f"{p.rps / q.rps:.2f}x — {'met' if p.rps >= 2 * q.rps else 'NOT met'}")
    return lines


@dataclass
class HostLoad:
    """The host's load average, and its CPU time so far with the hypervisor's share of it (steal): what a
    shared VM's other tenants took while the benchmark ran, beside the figures it moves."""

    average: tuple[float, float, float]
    total: int  # jiffies, all CPUs (/proc/stat)
    steal: int

    def __str__(self) -> str:
        return " ".join(f"{x:.2f}" for x in self.average)

    def steal_since(self, earlier: HostLoad) -> float | None:
        """The share of CPU time stolen between `earlier` and this snapshot (None: no time passed)."""
        total = self.total - earlier.total
        return (self.steal - earlier.steal) / total if total > 0 else None


def loadavg() -> HostLoad:
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    return HostLoad(os.getloadavg(), sum(fields), fields[7])


def print_report(console: Console, table: Table, lines: list[str], markdown: bool, load_before: HostLoad,
                 started: float, command: str) -> None:
    if markdown:
        table.box, table.title_justify = box.MARKDOWN, "left"
    console.print(table)
    for line in lines:
        console.print(line)
    console.print(f"command: {command}")
    after = loadavg()
    steal = after.steal_since(load_before)
    console.print(f"load average (1/5/15 min) before: {load_before}; after: {after}; "
                  f"{os.cpu_count()} cores shared; {time.perf_counter() - started:.0f} s in all"
                  + ("" if steal is None else f"; hypervisor steal {steal:.0%} of CPU time during the run"))


# -- polar vs direct --------------------------------------------------------------------------------


def common_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--requests", type=int, default=300,
                    help="timed requests per cell (at least 4 per client are always sent)")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64, 256], help="concurrent clients")
    ap.add_argument("--stream", choices=["no", "yes", "both"], default="both",
                    help="non-streamed and/or streamed calls")
    ap.add_argument("--sync", choices=["FULL", "NORMAL"], nargs="+", default=["FULL"],
                    help="polar's capture commit mode(s), one polar column each (polar_db_sync; FULL is the "
                         "default: an fsync per call; NORMAL survives a crash of polar but not of the machine)")
    ap.add_argument("--tokenizer", default=str(DEFAULT_TOKENIZER), help="tokenizer dir for the scripted double")
    ap.add_argument("--markdown", action="store_true", help="draw the table as Markdown (for docs/benchmarks.md)")


def rounds_arg(ap: argparse.ArgumentParser) -> None:
    """How run_matrix interleaves the targets."""
    ap.add_argument("--rounds", type=int, default=5,
                    help="each cell's requests in this many parts, the targets taking turns part by part")


def reference_args(ap: argparse.ArgumentParser) -> None:
    """The floors measured beside polar (`reference_targets`)."""
    ap.add_argument("--mitmdump", action="store_true",
                    help="also plain `mitmdump` reverse-proxying direct's request (its default addons, no script)")
    ap.add_argument("--floor", action="store_true",
                    help="also polar's floors: its mitmproxy with a one-job addon answering from memory "
                         "('mitm answers') and relaying to the upstream over polar's upstream client ('mitm relay')")


def check_args(ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.requests < 1 or min(args.concurrency) < 1 or getattr(args, "rounds", 1) < 1:
        ap.error("--requests, --concurrency and --rounds must be at least 1")
    if not (Path(args.tokenizer) / "tokenizer.json").exists():
        ap.error(f"no tokenizer at {args.tokenizer} (build one: scripts/build_tiny_model.py --tokenizer-only)")


def streams_of(choice: str) -> list[bool]:
    return {"no": [False], "yes": [True], "both": [False, True]}[choice]


def command_line(script: str, argv: Sequence[str]) -> str:
    return shlex.join(["python", f"scripts/{script}", *argv])


def polar_name(sync: str, syncs: list[str]) -> str:
    return "polar" if len(syncs) == 1 else f"polar {sync}"


def main(argv: Sequence[str] | None = None) -> list[Cell]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    common_args(ap)
    rounds_arg(ap)
    reference_args(ap)
    argv = list(sys.argv[1:] if argv is None else argv)
    args = ap.parse_args(argv)
    check_args(ap, args)
    console, started, load_before = Console(width=240), time.perf_counter(), loadavg()
    services: list[Service] = []
    with tempfile.TemporaryDirectory(prefix="polar-bench-proxy-") as tmp:
        try:
            upstream = start_upstream(Path(tmp), args.tokenizer)
            services.append(upstream)
            targets = [direct_target(upstream), *reference_targets(Path(tmp), upstream, args, services)]
            for sync in args.sync:
                targets.append(polar_target(Path(tmp), upstream, sync, polar_name(sync, args.sync)))
                services.append(targets[-1].proxy)
            check_targets(targets)
            cells = run_matrix(targets, upstream, args.concurrency, streams_of(args.stream), args.requests,
                               lambda line: console.print(f"[dim]{line}[/dim]"), args.rounds)
            stats = upstream_stats(upstream)
        finally:
            for service in reversed(services):
                service.stop()
    title = (f"polar vs direct upstream (polar: 1 process, captures synchronous={'/'.join(args.sync)}; "
             f"{os.cpu_count()} cores shared by client, proxy and upstream)")
    print_report(console, results_table(cells, title),
                 [*target_lines(cells, polar_name(args.sync[0], args.sync)), stats], args.markdown, load_before,
                 started, command_line("bench_proxy.py", argv))
    return cells


if __name__ == "__main__":
    main()
