"""The rollout benchmark's headline numbers, and `polar submit` against a live server."""

from __future__ import annotations

import json

from click.testing import CliRunner

from polar.cli.rollout import submit
from tests.rollout.conftest import ApiServer
from tests.support.scripts import load_script


def test_ready_buffer_keeps_running_slots_busy(monkeypatch):
    out = load_script(monkeypatch, "bench_rollout").bench(sessions=80, slots=4, init_workers=3, ready=4, postrun_workers=2, scale=0.0005)
    assert out["ready_buffer"]["occupancy_steady"] >= 0.9, out
    assert out["sequential"]["occupancy_steady"] < 0.8, out
    assert out["throughput_ratio"] > 1.2, out


def test_submit_follows_live_and_prints_a_summary(tmp_path):
    tasks = tmp_path / "tasks.jsonl"
    lines = [{"id": "a", "instruction": "x", "samples": 2, "metadata": {"sim": {"run": 2, "reward": 1.0}}},
             {"id": "b", "instruction": "x", "timeout": 1, "metadata": {"sim": {"run": 50, "reward": 0.0}}}]
    tasks.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    with ApiServer(tmp_path / "r.db") as server:
        out = CliRunner().invoke(submit, [str(tasks), "--server", server.url], catch_exceptions=False)
    assert out.exit_code == 0, out.output
    assert "submitted 2 tasks, 3 sessions" in out.output
    assert "rollout summary" in out.output
    rows = {line.split("│")[1].strip(): line for line in out.output.splitlines() if "│" in line}
    assert "ok=2" in rows["a"] and "1.000" in rows["a"]
    assert "timeout=1" in rows["b"]


def test_submit_without_a_server_says_how_to_start_one(tmp_path):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"instruction": "x"}\n')
    out = CliRunner().invoke(submit, [str(tasks), "--server", "http://127.0.0.1:9"])
    assert out.exit_code != 0 and "polar rollout serve" in out.output
