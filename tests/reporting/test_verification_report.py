"""`polar report --verification FILE`: the verdict of every trajectory, failed first, and a clear error
for a file that is not `polar verify --json` output."""

from __future__ import annotations

import re

from click.testing import CliRunner

from polar.cli import main
from polar.trajectories import prefix_merge
from tests.trajectories.crafted import Recorder, conversation
from tests.verify.crafted import results_file


def test_the_report_shows_each_trajectory_s_verdict(tmp_path):
    rec = Recorder(tmp_path / "captures.db")
    try:
        for session in ("good", "bad", "old", "unseen"):
            rec.call(session, [1, 2, 3, 4], [9, 10, 11], conversation(session, 0))
        rows = rec.rows()
    finally:
        rec.close()
    trajectories = prefix_merge(rows)
    ids = {t.session_id: t.id for t in trajectories}
    results = results_file(tmp_path / "verify.jsonl", trajectories, fail={ids["bad"]}, stale={ids["old"]},
                           skip={ids["unseen"]})
    out = tmp_path / "report.html"
    done = CliRunner().invoke(main, ["report", "--db", str(rec.path), "--out", str(out), "--verification",
                                     str(results)])
    assert done.exit_code == 0, done.output
    html = out.read_text()
    summary = dict(re.findall(r"<tr>\s*<th>([^<]+)</th>\s*<td>([^<]+)</td>", html))
    assert summary["verification"] == "1 of 4 trajectories within tolerance, 1 failed, 1 stale, 1 not verified"
    section = re.search(r'<section id="verification">.*?</section>', html, re.S).group(0)
    assert 'data-plot="verification"' in section
    body = [re.findall(r"<td[^>]*>([^<]+)</td>", r) for r in re.findall(r"<tr>(.*?)</tr>", section, re.S)[1:]]
    assert [(r[0], r[1]) for r in body] == [(ids["bad"], "failed"), (ids["old"], "stale"),
                                           (ids["unseen"], "not verified"), (ids["good"], "verified")]
    assert body[0][-1] == "4"  # the spike: the first sampled token, after prompt positions 0-3

    plain = CliRunner().invoke(main, ["report", "--db", str(rec.path), "--out", str(out)])
    assert plain.exit_code == 0 and 'id="verification"' not in out.read_text()


def test_a_file_that_is_not_verify_output_is_a_clear_error(tmp_path):
    rec = Recorder(tmp_path / "captures.db")
    try:
        rec.call("s", [1, 2], [3], conversation("s", 0))
    finally:
        rec.close()
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"trajectory": "s#1", "ok": true}\n')
    done = CliRunner().invoke(main, ["report", "--db", str(rec.path), "--out", str(tmp_path / "r.html"),
                                     "--verification", str(bad)])
    assert done.exit_code == 2
    assert "--verification" in done.output and "bad.jsonl:1 is not a `polar verify --json` line" in done.output
    assert "session, tokens, digest" in done.output
