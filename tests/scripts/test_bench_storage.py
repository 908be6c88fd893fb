"""scripts/bench_storage.py end to end on a tiny run through the real gateway: the table, and what it measures."""

from __future__ import annotations

import pytest

from tests.support.scripts import load_script


@pytest.mark.slow
def test_tiny_run_measures_both_encodings(tokenizer_dir, capsys, monkeypatch, tmp_path):
    bench = load_script(monkeypatch, "bench_storage")
    monkeypatch.setenv("COLUMNS", "250")
    # main() also checks that every stored body reads back as the client sent it (it raises otherwise).
    before, after, tokens = bench.main(["--sessions", "2", "--turns", "3", "--tokenizer", str(tokenizer_dir),
                                        "--dir", str(tmp_path), "--markdown"])
    out = capsys.readouterr().out
    assert "| whole DB" in out and "python scripts/bench_storage.py --sessions 2" in out
    assert tokens > 2 * 20_000  # two sessions past the ~89 KB first request
    # The same rows, stored differently: bodies, canonical requests, results, messages and prompt ids.
    assert after["token columns"] < before["token columns"] / 2 and after["result"] < before["result"]
    assert after["request bodies"] < before["request bodies"] / 2 and after["canonical"] < before["canonical"] / 10
    # Streamed answers: ~14x smaller when every token is its own event; ~3x when the unpaced upstream's tokens
    # arrive together and go out as a few events (the bodies are then small to begin with).
    assert after["response_body"] < before["response_body"] / 2
    assert after["whole DB"] < before["whole DB"]
