"""A replica's vLLM metrics as the fleet reads them. The exposition is made by prometheus_client with the
names, types and labels vLLM 0.32 registers (vllm/v1/metrics/loggers.py: counters per engine, which the
client exports with `_total`); tests/integration/test_fleet_real_vllm.py reads a real server's."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from polar.upstream.fleet.metrics import hit_rate, parse_metrics


def _exposition(hits: dict[str, int], queries: dict[str, int], running: int) -> str:
    registry = CollectorRegistry()
    labels = ["model_name", "engine"]
    hit = Counter("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.", labels,
                  registry=registry)
    query = Counter("vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens.",
                    labels, registry=registry)
    Counter("vllm:external_prefix_cache_hits", "KV connector hits.", labels, registry=registry).labels(
        "polar-tiny", "0").inc(999)
    gauge = Gauge("vllm:num_requests_running", "Requests in model execution batches.", labels, registry=registry)
    for engine, n in hits.items():
        hit.labels("polar-tiny", engine).inc(n)
    for engine, n in queries.items():
        query.labels("polar-tiny", engine).inc(n)
    gauge.labels("polar-tiny", "0").set(running)
    return generate_latest(registry).decode()


def test_the_prefix_cache_counters_are_summed_over_engines_and_give_the_hit_rate():
    metrics = parse_metrics(_exposition({"0": 300, "1": 100}, {"0": 800, "1": 200}, 3))
    assert metrics == {"prefix_cache_hits": 400.0, "prefix_cache_queries": 1000.0, "requests_running": 3.0}
    assert hit_rate(metrics) == 0.4
    assert hit_rate({}) is None and hit_rate(parse_metrics("# nothing here\n")) is None


def test_polar_report_reads_each_replica_s_hit_rate_from_its_metrics(tmp_path):
    from click.testing import CliRunner
    from prometheus_client import start_http_server

    from polar.cli import main
    from polar.mitm.proxy import free_port
    from tests.support.captures import Recorder

    registry = CollectorRegistry()
    labels = ["model_name", "engine"]
    Counter("vllm:prefix_cache_hits", "hits", labels, registry=registry).labels("polar-tiny", "0").inc(750)
    Counter("vllm:prefix_cache_queries", "queries", labels, registry=registry).labels("polar-tiny", "0").inc(1000)
    port = free_port()
    server, thread = start_http_server(port, "127.0.0.1", registry=registry)  # prometheus_client's own exporter
    serving, silent = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{free_port()}"
    try:
        rec = Recorder(tmp_path / "c.db")
        for session, replica in (("s1", serving), ("s2", silent)):
            end = rec._end("ok", None, None, None, replica=replica)
            rec._write(session, end, "test")
        rec.close()
        out = CliRunner().invoke(main, ["report", "--db", str(tmp_path / "c.db"), "--out", str(tmp_path / "r.html"),
                                        "--upstream", serving, "--upstream", silent])
    finally:
        server.shutdown()
    assert out.exit_code == 0, out.output
    html = (tmp_path / "r.html").read_text()
    assert "vLLM prefix-cache hit rate" in html and "75.0%" in html and "no answer" in html
