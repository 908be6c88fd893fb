"""`polar verify` as a command: exit status, the JSON lines, the results file, the table, clear errors."""

from __future__ import annotations

import json
import sqlite3

from click.testing import CliRunner

from polar.cli import main
from tests.support.captures import Recorder, rewrite_completion
from tests.verify.conftest import faithful, record_session


def run(*args):
    return CliRunner().invoke(main, ["verify", *map(str, args)], catch_exceptions=False)


def test_clean_captures_exit_0_with_one_json_line_per_trajectory(tmp_path, fake_worker, model_dir):
    db = tmp_path / "captures.db"
    rec = record_session(db, "s1")
    rec.call("s2", [5, 6], [30, 31], logprobs=faithful([30, 31], 0.001))
    rec.close()
    out = tmp_path / "verify.jsonl"
    done = run("--db", db, "--model", model_dir, "--python", fake_worker, "--json", "--out", out, "--tolerance", 0.05)
    assert done.exit_code == 0, done.output
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    assert [(x["trajectory"], x["session"], x["tokens"], x["ok"]) for x in lines] == [
        ("s1#1", "s1", 15, True), ("s2#4", "s2", 2, True)]
    assert all(x["max_abs_diff"] < 0.05 and x["mean_abs_diff"] <= x["max_abs_diff"] for x in lines)
    assert [json.loads(line) for line in out.read_text().splitlines()] == lines
    assert "2/2 trajectories within |Δ| ≤ 0.05" in done.stderr


def test_an_altered_trajectory_exits_1_and_is_named(tmp_path, fake_worker, model_dir):
    db = tmp_path / "captures.db"
    record_session(db, "s1", noise=0.0).close()
    rec = Recorder(db)
    rec.call("s2", [5, 6], [30, 31], logprobs=faithful([30, 31]))
    rec.close()
    conn = sqlite3.connect(db)
    (row_id,), = conn.execute("SELECT id FROM calls WHERE session_id='s1' ORDER BY id LIMIT 1")
    conn.close()

    def bumped(ids, logprobs):
        ids[[0, 3]] += 1
        return ids, logprobs

    rewrite_completion(db, row_id, bumped)
    done = run("--db", db, "--model", model_dir, "--python", fake_worker, "--json", "--tolerance", 0.5)
    assert done.exit_code == 1
    s1, s2 = (json.loads(line) for line in done.stdout.splitlines())
    assert not s1["ok"] and s1["spike_positions"] == [4, 7] and s2["ok"]
    table = run("--db", db, "--model", model_dir, "--python", fake_worker, "--tolerance", 0.5)
    assert table.exit_code == 1
    assert "s1#1" in table.stdout and "mismatch" in table.stdout and "4, 7" in table.stdout
    assert "1/2 trajectories within |Δ| ≤ 0.5" in table.stdout and "1 out of tolerance (2 spikes)" in table.stdout


def test_a_run_that_cannot_go_ahead_exits_2_with_the_reason(tmp_path, fake_worker, model_dir):
    db = tmp_path / "captures.db"
    rec = Recorder(db)
    rec.fail("s")
    rec.close()
    results = tmp_path / "verify.jsonl"
    done = run("--db", db, "--model", model_dir, "--python", fake_worker, "--out", results)
    assert done.exit_code == 2 and "no trajectory to verify" in done.output
    assert not results.exists() and not tmp_path.joinpath("verify.jsonl.partial").exists()  # no half a file
    record_session(tmp_path / "ok.db").close()
    done = run("--db", tmp_path / "ok.db", "--model", tmp_path, "--python", fake_worker)
    assert done.exit_code == 2 and "not a model directory" in done.output
    for bad in ("-1", "nan"):
        done = run("--db", tmp_path / "ok.db", "--model", model_dir, "--tolerance", bad)
        assert done.exit_code == 2 and "--tolerance" in done.output


def test_tolerance_is_an_option(tmp_path, fake_worker, model_dir):
    db = tmp_path / "captures.db"
    record_session(db, noise=0.2).close()
    assert run("--db", db, "--model", model_dir, "--python", fake_worker, "--json").exit_code == 0
    tight = run("--db", db, "--model", model_dir, "--python", fake_worker, "--json", "--tolerance", 0.1)
    assert tight.exit_code == 1 and json.loads(tight.stdout)["spikes"] == 15
    assert "most tokens are off: is --model the weights" in tight.stderr
