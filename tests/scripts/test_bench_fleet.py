"""scripts/bench_fleet.py at a small size: every session's calls answered, affinity kept, the figures sane."""

from __future__ import annotations

from tests.support.scripts import load_script


def test_the_fleet_bench_runs_and_polar_keeps_sessions_where_round_robin_does_not(monkeypatch, capsys):
    bench = load_script(monkeypatch, "bench_fleet")
    polar, round_robin = bench.main(["--replicas", "4", "--sessions", "32", "--turns", "3", "--samples", "4",
                                     "--tick", "0.002"])
    assert polar["calls"] == round_robin["calls"] == 32 * 3
    assert sum(r["calls"] for r in polar["per_replica"]) == 96 and len(polar["per_replica"]) == 4
    assert sum(r["sessions"] for r in polar["per_replica"]) == 32
    assert all(r["calls"] > 0 for r in polar["per_replica"])  # no replica left idle
    assert polar["affinity_kept"] > 0.9 and polar["placements"]["prefix"] > 0  # (no overload at this size)
    assert polar["prefix_hit_rate"] > round_robin["prefix_hit_rate"] > 0
    assert polar["routing_us_median"] > 0 and "affinity kept" in capsys.readouterr().out
