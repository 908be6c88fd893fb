"""A verification run over a real capture DB, its worker a torch-free stand-in: rebuild, recompute, judge,
and the clear errors of a run that cannot go ahead."""

from __future__ import annotations

import sqlite3
import sys

import pytest

from polar.verify import Tolerance, VerifyError, find_python, verify
from tests.support.captures import Recorder, rewrite_completion
from tests.verify.conftest import faithful, record_session


def test_faithful_captures_verify_within_tolerance(tmp_path, fake_worker, model_dir):
    db = tmp_path / "captures.db"
    record_session(db, noise=0.01).close()
    run = verify(db, model_dir, python=fake_worker, tolerance=Tolerance(0.05))
    (check,) = run.checks
    assert run.ok and check.ok and check.tokens == 15 and check.turns == 3
    assert check.max_abs_diff == pytest.approx(0.01, abs=1e-6)
    assert run.worker["dtype"] == "float32" and run.worker["python"] == sys.executable
    summary = run.summary()
    assert summary["trajectories"] == 1 and summary["ok"] == 1 and summary["tokens"] == 15
    assert summary["abs_diff"]["max"] == pytest.approx(0.01, abs=1e-6)


def test_altered_sampled_ids_are_flagged_where_they_were_altered(tmp_path, fake_worker, model_dir):
    db = tmp_path / "captures.db"
    record_session(db, noise=0.0).close()
    conn = sqlite3.connect(db)  # the middle turn's 2nd sampled id: 17 → 19 (logprob −3 → −5)
    (row_id,) = conn.execute("SELECT id FROM calls ORDER BY id LIMIT 1 OFFSET 1").fetchone()
    conn.close()

    def altered(ids, logprobs):
        ids[1] = 19
        return ids, logprobs

    rewrite_completion(db, row_id, altered)
    run = verify(db, model_dir, python=fake_worker, tolerance=Tolerance(0.05))
    (check,) = run.checks
    assert not run.ok and check.status == "mismatch"
    assert check.spike_positions == [4 + 5 + 2 + 1]  # prompt 4, turn 1's 5, glue 2, then the 2nd id
    assert check.spike_details[0]["token_id"] == 19 and check.spike_details[0]["turn"] == 1


def test_rows_without_logprobs_are_reported_not_compared(tmp_path, fake_worker, model_dir):
    db = tmp_path / "captures.db"
    rec = Recorder(db)
    rec.call("a", [1, 2], [10, 11, 12], no_logprobs=True)
    rec.call("a", [1, 2, 10, 11, 12, 5], [13, 14], logprobs=faithful([13, 14]))
    rec.call("b", [3, 4], [20, 21], no_logprobs=True)
    rec.close()
    run = verify(db, model_dir, python=fake_worker)
    a, b = run.checks
    assert a.ok and a.tokens == 2 and a.missing == 3
    assert not b.ok and b.status == "no-logprobs" and b.tokens == 0 and b.missing == 2
    assert not run.ok and run.summary()["no_logprobs"] == 1


def test_one_session_and_the_per_request_builder(tmp_path, fake_worker, model_dir):
    db = tmp_path / "captures.db"
    rec = record_session(db)
    rec.call("other", [7, 7], [8, 9], logprobs=faithful([8, 9]))
    rec.close()
    assert [c.session for c in verify(db, model_dir, python=fake_worker, session="other").checks] == ["other"]
    per_call = verify(db, model_dir, python=fake_worker, builder="per-request").checks
    assert len(per_call) == 4 and all(c.ok for c in per_call)


def test_a_db_without_trajectories_is_a_clear_error(tmp_path, fake_worker, model_dir):
    db = tmp_path / "captures.db"
    rec = Recorder(db)
    rec.fail("s")
    rec.count_tokens("s")
    rec.close()
    with pytest.raises(VerifyError, match="no trajectory to verify .* 2 captured calls, 0 with tokens"):
        verify(db, model_dir, python=fake_worker)
    with pytest.raises(VerifyError, match="not a polar capture database"):
        verify(model_dir / "config.json", model_dir, python=fake_worker)
    with pytest.raises(VerifyError, match="no capture database"):
        verify(tmp_path / "nope.db", model_dir, python=fake_worker)


def test_a_model_whose_vocabulary_does_not_fit_the_ids_is_a_clear_error(tmp_path, fake_worker, model_dir):
    db = tmp_path / "captures.db"
    rec = Recorder(db)
    rec.call("s", [1, 2], [5000, 6])  # the fake model has 1000 ids
    rec.close()
    with pytest.raises(VerifyError, match=r"token id 5000, outside the vocabulary of .*\(1000 ids\)"):
        verify(db, model_dir, python=fake_worker)


def test_bad_model_dirs_pythons_and_dying_workers(tmp_path, fake_worker, model_dir, monkeypatch):
    db = tmp_path / "captures.db"
    rec = record_session(db)
    rec.call("dies", [666], [666], logprobs=[-0.1])
    rec.close()
    with pytest.raises(VerifyError, match="not a model directory"):
        verify(db, tmp_path, python=fake_worker)
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text("{}")
    with pytest.raises(VerifyError, match="cannot load .*broken.*OSError: no weights"):
        verify(db, broken, python=fake_worker)
    with pytest.raises(VerifyError, match="no Python at /nowhere/python"):
        verify(db, model_dir, python="/nowhere/python")
    with pytest.raises(VerifyError, match="exited with 9:\na stray line on stderr"):
        verify(db, model_dir, python=fake_worker)


def test_which_python_runs_the_worker(monkeypatch, tmp_path):
    import importlib.util

    monkeypatch.setenv("POLAR_VERIFY_PYTHON", sys.executable)
    assert find_python() == sys.executable
    assert find_python("python3")  # a name on PATH
    monkeypatch.delenv("POLAR_VERIFY_PYTHON")
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)  # this Python has no torch
    with pytest.raises(VerifyError, match=r"polar\[verify\].*--python PATH or POLAR_VERIFY_PYTHON"):
        find_python()
