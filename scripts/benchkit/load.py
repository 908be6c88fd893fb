"""Load: N clients, one keep-alive connection each, driving a target; cells of timed calls with the CPU the
proxy and the upstream spent on them; the targets taking turns so a burst of the host's falls on all alike."""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import aiohttp

from benchkit.targets import Service, Target, cpu_seconds


def percentile(values: Sequence[float], q: int) -> float:
    """The q-th percentile (inclusive method; NaN for no values)."""
    if not values:
        return float("nan")
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def streams_of(choice: str) -> list[bool]:
    """--stream no|yes|both as the stream modes to measure."""
    return {"no": [False], "yes": [True], "both": [False, True]}[choice]


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
    front_cpu: float | None = None  # of proxy_cpu, the target's front process (None: no front)
    load_cpu: float = 0.0  # this process's: the load generator

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


class CpuMeter:
    """The CPU each part of a measurement spends between `start` and `used` (seconds; None: no such part): the
    proxy process with its children, its main thread, a front process among them, the upstream, and this
    process (the load generator)."""

    def __init__(self, proxy: Service | None, upstream: Service | None, front: int | None = None):
        self.proxy, self.upstream, self.front = proxy, upstream, front
        self.marks: dict[str, float | None] = {}

    def read(self) -> dict[str, float | None]:
        proxy, upstream = self.proxy, self.upstream
        return {"proxy": proxy.cpu_seconds() if proxy else None,
                "main_thread": proxy.main_thread_cpu_seconds() if proxy else None,
                "front": cpu_seconds(self.front) if self.front else None,
                "upstream": upstream.cpu_seconds() if upstream else None, "load": time.process_time()}

    def start(self) -> None:
        self.marks = self.read()

    def used(self) -> dict[str, float | None]:
        return {k: None if v is None else v - self.marks[k] for k, v in self.read().items()}  # type: ignore[operator]


def split(n: int, parts: int) -> list[int]:
    """`n` calls in `parts` blocks (at least one, at most `n`), as even as they go."""
    parts = max(1, min(parts, n))
    return [n // parts + (i < n % parts) for i in range(parts)]


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
    """One cell: `n` calls from `clients` clients, with the CPU the proxy (its main thread and front apart), the
    upstream and the load generator spent on them."""
    meter = CpuMeter(target.proxy, upstream, target.front)
    latencies, errors, wall = asyncio.run(drive(target, stream, clients, n, meter.start))
    cpu = meter.used()
    return Cell(target.name, stream, clients, latencies, errors, wall, cpu["proxy"], cpu["upstream"] or 0.0,
                cpu["main_thread"], cpu["front"], cpu["load"] or 0.0)


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
            done: dict[str, list[Cell]] = {t.name: [] for t in targets}
            for part in split(n, min(rounds, n // (2 * clients))):  # each part at least two calls a client
                for target in targets:
                    done[target.name].append(measure(target, upstream, stream, clients, part))
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
                sum(p.upstream_cpu for p in parts), total([p.main_thread_cpu for p in parts]),
                total([p.front_cpu for p in parts]), sum(p.load_cpu for p in parts))
