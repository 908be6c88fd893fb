"""A benchmark run and its report: the work dir and the services it started (stopped at its end), its tables
(Markdown with --markdown), the lines read off them, the command line, the host's load and the hypervisor's
steal over the run: what moves the figures on a shared VM, printed beside them."""

from __future__ import annotations

import os
import shlex
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from rich import box
from rich.console import Console
from rich.table import Table

from benchkit.load import Cell
from benchkit.targets import FLOOR_TARGETS, Service, Target


def ms(value: float | None, digits: int = 2) -> str:
    """A figure for a table: '–' for none (or NaN: a percentile of no values)."""
    return "–" if value is None or value != value else f"{value:.{digits}f}"


def table(title: str, columns: Sequence[str], left: Sequence[str] = ("stream", "target"),
          no_wrap: bool = False) -> Table:
    """A results table: the `left` columns flush left, the figures right (`no_wrap`: a cell on one line,
    however wide); Markdown at the report (`as_markdown`)."""
    out = Table(title=title)
    for col in columns:
        out.add_column(col, justify="left" if col in left else "right", no_wrap=no_wrap)
    return out


def as_markdown(tables: Sequence[Table]) -> None:
    for t in tables:
        t.box, t.title_justify = box.MARKDOWN, "left"


def command_line(script: str, argv: Sequence[str]) -> str:
    return shlex.join(["python", f"scripts/{script}", *argv])


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


def print_report(console: Console, tables: Table | Sequence[Table], lines: list[str], markdown: bool,
                 load_before: HostLoad, started: float, command: str) -> None:
    tables = [tables] if isinstance(tables, Table) else list(tables)
    if markdown:
        as_markdown(tables)
    for t in tables:
        console.print(t)
    for line in lines:
        console.print(line)
    console.print(f"command: {command}")
    after = loadavg()
    steal = after.steal_since(load_before)
    console.print(f"load average (1/5/15 min) before: {load_before}; after: {after}; "
                  f"{os.cpu_count()} cores shared; {time.perf_counter() - started:.0f} s in all"
                  + ("" if steal is None else f"; hypervisor steal {steal:.0%} of CPU time during the run"))


class Run:
    """One benchmark run: its console, a work dir (removed at the end, unless `keep` names it), the services it
    starts (stopped at the end, the last started first, whatever happened), and what its report says about it."""

    def __init__(self, script: str, argv: Sequence[str], width: int | None = 240, dir: str | Path | None = None,
                 keep: Path | None = None):
        self.script, self.argv = script, list(argv)
        self.console = Console(width=width)
        self.started, self.load_before = time.perf_counter(), loadavg()
        self.services: list[Service] = []
        self._dir, self._keep = dir, keep
        self._tmp: tempfile.TemporaryDirectory | None = None
        self.work = Path()

    def __enter__(self) -> Run:
        self._tmp = tempfile.TemporaryDirectory(prefix=f"polar-{Path(self.script).stem.replace('_', '-')}-",
                                                dir=self._dir)
        self.work = self._keep or Path(self._tmp.name)
        self.work.mkdir(parents=True, exist_ok=True)
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.stop()
        finally:
            if self._tmp is not None:
                self._tmp.cleanup()

    def stop(self) -> None:
        """Stop every service started so far, the last first (again at the end: a no-op)."""
        for service in reversed(self.services):
            service.stop()

    def start(self, service: Service) -> Service:
        """A service started for this run, to stop at its end."""
        self.services.append(service)
        return service

    def add(self, target: Target) -> Target:
        """A target whose proxy (if any) this run stops at its end."""
        if target.proxy is not None:
            self.services.append(target.proxy)
        return target

    def progress(self, line: str) -> None:
        self.console.print(f"[dim]{line}[/dim]")

    @property
    def command(self) -> str:
        return command_line(self.script, self.argv)

    def report(self, tables: Table | Sequence[Table], lines: list[str], markdown: bool) -> None:
        print_report(self.console, tables, lines, markdown, self.load_before, self.started, self.command)


# -- the small call's proxy overhead (bench_proxy, bench_peers) --------------------------------------


# A table's column: its header and its figure for a cell, given direct's cell at the same point (None: none, or this
# cell is direct's).
Column = tuple[str, Callable[[Cell, Cell | None], str]]


def call_columns(calls: str = "requests", rate: str = "req/s", versus: str = "req/s vs direct") -> list[Column]:
    """The columns a table of cells starts with: the cell, its latency and rate, and both against direct's."""
    return [
        ("stream", lambda c, _: "yes" if c.stream else "no"), ("clients", lambda c, _: str(c.clients)),
        ("target", lambda c, _: c.target), (calls, lambda c, _: str(c.ok + len(c.errors))),
        ("errors", lambda c, _: str(len(c.errors))), ("p50 ms", lambda c, _: ms(c.pct(50))),
        ("p99 ms", lambda c, _: ms(c.pct(99))),
        ("added p50 ms", lambda c, base: ms(base and c.pct(50) - base.pct(50))),
        ("added p99 ms", lambda c, base: ms(base and c.pct(99) - base.pct(99))),
        (rate, lambda c, _: f"{c.rps:.0f}"),
        (versus, lambda c, base: f"{c.rps / base.rps:.2f}" if base and base.rps else "–"),
    ]


def cpu_column(name: str, seconds: Callable[[Cell], float | None]) -> Column:
    """CPU milliseconds per call of one part (`seconds`: its CPU over the cell)."""
    return name, lambda c, _: ms(c.cpu_ms(seconds(c)))


def cells_table(cells: list[Cell], title: str, columns: Sequence[Column]) -> Table:
    """One row per cell, each figure beside direct's at the same point."""
    out = table(title, [name for name, _ in columns])
    direct = {(c.stream, c.clients): c for c in cells if c.target == "direct"}
    for c in cells:
        base = direct.get((c.stream, c.clients))
        out.add_row(*(figure(c, None if base is c else base) for _, figure in columns))
    return out


def results_table(cells: list[Cell], title: str) -> Table:
    """The small call's proxy overhead: one row per target and concurrency, against direct."""
    return cells_table(cells, title, [
        *call_columns(), cpu_column("proxy CPU ms/req", lambda c: c.proxy_cpu),
        cpu_column("· main thread", lambda c: c.main_thread_cpu), cpu_column("upstream CPU ms/req", lambda c: c.upstream_cpu)])


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
