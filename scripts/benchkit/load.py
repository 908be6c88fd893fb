"""Load: N clients, one keep-alive connection each, driving a target; cells of timed calls with the CPU the
proxy and the upstream spent on them; the targets taking turns so a burst of the host's falls on all alike."""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import aiohttp

from benchkit.targets import Service, Target


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
    """One cell: `n` calls from `clients` clients, with the CPU the proxy (its main thread apart) and the
    upstream spent on them."""
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
