"""scripts/bench_tokens.py end to end on a tiny session: the tables it prints and the numbers behind them."""

from __future__ import annotations

from tests.support.scripts import load_script


def test_tiny_run_prints_every_table(tokenizer_dir, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")  # one line per table row, so headers are not wrapped
    bench = load_script(monkeypatch, "bench_tokens")
    results = bench.main(["--sizes", "1k", "--turns", "3", "--repeat", "1", "--tokenizer", str(tokenizer_dir)])
    out = capsys.readouterr().out

    for title in ("Prompt building per turn", "Capture storage per session", "Trajectories per session"):
        assert title in out
    for column in ("new tok/turn", "re-render mean", "re-render p50", "faithful mean", "faithful p50", "speedup",
                   "prefix kept", "same ids", "token cols", "full prompts", "full / linear", "DB file", "DB B/tok",
                   "rows / call", "trainer tokens", "trainable tokens"):
        assert column in out, column
    assert "per-request" in out and "prefix-merge" in out

    (run,) = results
    assert run.calls == 3 and abs(run.tokens - 1024) < 400
    # Every later call kept its prefix, and with the project template a re-render agrees with it.
    assert [b.mode for b in run.built[1:]] == ["token-faithful"] * 2
    assert all(b.identical for b in run.built[1:])
    # Linear storage: each prompt id once at most 4 bytes (long new runs of ids are compressed), each sampled
    # id and its logprob 4 + 4 bytes as they are.
    sampled = run.builds["prefix-merge"]["trainable"]
    assert 8 * sampled < run.stored.token_bytes <= 4 * (run.tokens + sampled)
    assert run.stored.full_bytes > run.stored.token_bytes
    # One trajectory for the linear session; one per call per-request; the same tokens trainable.
    assert run.builds["per-request"]["trajectories"] == 3
    assert run.builds["prefix-merge"]["trajectories"] == 1
    assert run.builds["prefix-merge"]["trainable"] == run.builds["per-request"]["trainable"] > 0
