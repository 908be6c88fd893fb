"""The verdict on one trajectory: |Δ| statistics, importance-ratio drift, spikes, missing logprobs."""

from __future__ import annotations

import math

import pytest

from polar.trajectories.model import Trajectory, Turn
from polar.verify.compare import SPIKES_LISTED, Tolerance, checked_positions, compare, digest


def traj(logprobs_sampled: list[float | None], context: int = 3, tid: str = "s#1") -> Trajectory:
    n = context + len(logprobs_sampled)
    return Trajectory(id=tid, builder="prefix-merge", session_id="s", token_ids=list(range(100, 100 + n)),
                      loss_mask=[0] * context + [1] * len(logprobs_sampled),
                      logprobs=[0.0] * context + list(logprobs_sampled),
                      turns=[Turn(row_id=1, call_id="c1", prompt_start=0, completion_start=context, completion_end=n)])


def test_within_tolerance_is_ok_with_the_statistics():
    t = traj([-0.5, -1.0, -2.0, -0.1])
    positions, missing = checked_positions(t)
    assert positions == [3, 4, 5, 6] and missing == 0
    check = compare(t, positions, [-0.6, -1.0, -1.8, -0.1], missing, Tolerance(0.25, 0.2))
    assert check.ok and check.status == "ok" and check.spikes == 0 and check.spike_positions == []
    assert check.tokens == 4
    assert check.max_abs_diff == pytest.approx(0.2)
    assert check.mean_abs_diff == pytest.approx(0.3 / 4)
    # exp(0.2) - 1 = 0.221 > 0.2, exp(-0.1) - 1 = -0.095: one token of four is off in ratio
    assert check.ratio_off == pytest.approx(0.25)


def test_spikes_are_exactly_the_positions_over_tolerance():
    t = traj([-0.5] * 10)
    positions, missing = checked_positions(t)
    recomputed = [-0.5] * 10
    recomputed[2], recomputed[7] = -3.0, -0.5 + 0.51
    check = compare(t, positions, recomputed, missing, Tolerance(0.5))
    assert not check.ok and check.status == "mismatch"
    assert check.spike_positions == [5, 10] and check.spikes == 2
    first = check.spike_details[0]
    assert first == {"position": 5, "turn": 0, "token_id": 105, "captured": -0.5, "recomputed": -3.0, "diff": -2.5}


def test_missing_logprobs_are_counted_never_compared_as_zero():
    t = traj([None, None, -0.5, None])
    positions, missing = checked_positions(t)
    assert positions == [5] and missing == 3
    check = compare(t, positions, [-0.5], missing)
    assert check.ok and check.tokens == 1 and check.missing == 3
    none = traj([None, None])
    positions, missing = checked_positions(none)
    check = compare(none, positions, [], missing)
    assert not check.ok and check.status == "no-logprobs" and check.tokens == 0 and check.missing == 2
    assert check.max_abs_diff is None and check.mean_abs_diff is None and check.ratio_off is None


def test_non_finite_logprobs_are_spikes_and_json_stays_strict():
    import json

    t = traj([-0.5, -math.inf, -0.5])
    positions, missing = checked_positions(t)
    check = compare(t, positions, [-math.inf, -math.inf, None], missing)  # None: the worker had nothing there
    assert check.spike_positions == [3, 4, 5] and check.nonfinite == 3 and check.max_abs_diff is None
    line = json.dumps(check.to_json(), allow_nan=False)  # no Infinity / NaN in the results file
    assert json.loads(line)["spike_details"][0]["recomputed"] is None


def test_the_json_line_has_the_documented_fields():
    t = traj([-0.5])
    check = compare(t, *checked_positions(t)[:1], [-0.5], 0)
    line = check.to_json()
    for key in ("trajectory", "session", "tokens", "max_abs_diff", "mean_abs_diff", "ok", "missing", "ratio_off",
                "spike_positions", "status", "tolerance", "digest"):
        assert key in line
    assert line["trajectory"] == "s#1" and line["session"] == "s" and line["digest"] == digest(t)


def test_many_spikes_are_all_counted_and_some_detailed():
    t = traj([-0.5] * 100)
    positions, missing = checked_positions(t)
    check = compare(t, positions, [-5.0] * 100, missing)
    assert check.spikes == 100 and len(check.spike_positions) == 100 and len(check.spike_details) == SPIKES_LISTED


def test_digest_follows_tokens_mask_and_captured_logprobs():
    a = traj([-0.5, -1.0])
    assert digest(a) == digest(traj([-0.5, -1.0]))
    assert digest(a) != digest(traj([-0.5, -1.5]))
    assert digest(a) != digest(traj([-0.5, None]))
    assert digest(a) != digest(traj([-0.5, -1.0], context=4))


def test_bad_tolerances_and_lengths_are_refused():
    with pytest.raises(ValueError):
        Tolerance(-1)
    with pytest.raises(ValueError):
        Tolerance(math.nan)
    t = traj([-0.5])
    with pytest.raises(ValueError):
        compare(t, [3], [], 0)


def test_digest_survives_the_trip_through_a_rollout_state(tmp_path):
    """Verify rebuilds trajectories from the capture DB; export reads them back from the rollout state's JSON.
    Both must give one digest, or every result would read as stale."""
    from polar.trajectories import prefix_merge
    from tests.support.captures import Recorder

    rec = Recorder(tmp_path / "captures.db")
    rec.call("s", [1, 2, 3], [4, 5, 6], logprobs=[-0.1234567, -1e-8, -17.25])
    rec.call("s", [1, 2, 3, 4, 5, 6, 7], [8], no_logprobs=True)
    rows = rec.rows()
    rec.close()
    (built,) = prefix_merge(rows)
    stored = Trajectory.model_validate_json(built.model_dump_json())
    assert digest(stored) == digest(built)
