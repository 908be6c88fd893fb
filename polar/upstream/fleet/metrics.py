"""What each replica's vLLM says of itself on GET /metrics (Prometheus text): its prefix-cache hits and
queries (counters, in tokens: `vllm:prefix_cache_hits`, `vllm:prefix_cache_queries`) and its requests running
and waiting (gauges). Summed over the engines and label sets a server exports."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from polar.upstream.stall import get

SCRAPED = {
    "vllm:prefix_cache_hits": "prefix_cache_hits",
    "vllm:prefix_cache_queries": "prefix_cache_queries",
    "vllm:num_requests_running": "requests_running",
    "vllm:num_requests_waiting": "requests_waiting",
}


def parse_metrics(text: str) -> dict[str, float]:
    """The SCRAPED metrics found in a Prometheus exposition, under their short names."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        short = SCRAPED.get(family.name)
        if short is None:
            continue
        samples = [s for s in family.samples if s.name in (family.name, family.name + "_total")]
        out[short] = sum(s.value for s in samples)
    return out


def hit_rate(metrics: dict[str, float]) -> float | None:
    """Prefix-cache hit rate in tokens since the server started, or None before any query."""
    queries = metrics.get("prefix_cache_queries")
    return metrics.get("prefix_cache_hits", 0.0) / queries if queries else None


async def scrape(url: str, timeout: float, headers: dict[str, str] | None = None) -> dict[str, float] | None:
    """The replica's SCRAPED metrics, or None when it does not answer /metrics with 200."""
    reply = await get(url, "/metrics", timeout, headers)
    if reply is None or reply[0] != 200:
        return None
    try:
        return parse_metrics(reply[1].decode("utf-8", "replace"))
    except ValueError:  # not Prometheus text
        return None
