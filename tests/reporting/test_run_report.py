"""`polar report`: the HTML report of a run, opened in the real headless Chromium.

The main-job test reports on the README's main job (rollout state + captures), renders the page to
a full-page screenshot and checks every plot is there, loaded, and drawn (not blank) where the page
shows it. The capture-only test crafts a session with a fork, a broken prefix, a truncated turn
and a failed call, and checks the report counts each of them.
"""

from __future__ import annotations

import base64
import io
import re
import sqlite3
import statistics
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from polar.cli import main
from polar.rollout.state import RolloutState
from polar.trajectories import drift_report
from tests.trajectories.crafted import Recorder, conversation

SECTIONS = ["summary", "rewards", "tokens", "timings", "prefix-merge", "drift"]
PLOT_SECTION = {"rewards": "rewards", "tokens": "tokens", "timings": "timings", "latency": "timings",
                "prefix-merge": "prefix-merge", "drift": "drift"}


def run_report(*args: str) -> tuple[int, str]:
    done = CliRunner().invoke(main, ["report", *args])
    return done.exit_code, done.output


def open_report(browser, html: Path, shot: Path) -> tuple[object, list[dict], Image.Image, list[str]]:
    """Load the page, record every request it makes, and take a full-page screenshot."""
    page = browser.new_page(viewport={"width": 1280, "height": 900}, device_scale_factor=1)
    requests: list[str] = []
    page.on("request", lambda r: requests.append(r.url))
    page.goto(html.as_uri())
    plots = page.evaluate("""() => [...document.querySelectorAll('figure.plot')].map(f => {
        const img = f.querySelector('img'), r = img.getBoundingClientRect();
        return {key: f.dataset.plot, section: f.closest('section').id, complete: img.complete,
                width: img.naturalWidth, height: img.naturalHeight, src: img.getAttribute('src').slice(0, 22),
                x: r.left + window.scrollX, y: r.top + window.scrollY, w: r.width, h: r.height};
    })""")
    shot.write_bytes(page.screenshot(full_page=True))
    return page, plots, Image.open(shot).convert("RGB"), requests


def assert_drawn(plots: list[dict], screenshot: Image.Image) -> None:
    """Every plot image decoded to a real size and its area of the screenshot is not blank."""
    for p in plots:
        assert p["complete"] and p["width"] > 200 and p["height"] > 100, p
        assert p["src"] == "data:image/png;base64,", p
        assert PLOT_SECTION[p["key"]] == p["section"], p
        # Inside the image's 1px CSS border: only what the PNG itself shows.
        box = (round(p["x"]) + 4, round(p["y"]) + 4, round(p["x"] + p["w"]) - 4, round(p["y"] + p["h"]) - 4)
        assert box[2] <= screenshot.width and box[3] <= screenshot.height, (p, screenshot.size)
        pixels = np.asarray(screenshot.crop(box)).reshape(-1, 3).astype(int)
        background = np.array([255, 255, 255])
        ink = pixels[np.abs(pixels - background).max(axis=1) > 40]
        assert len(ink) > 0.02 * len(pixels), (p["key"], len(ink), len(pixels))
        colours = {tuple(c // 32) for c in ink}  # text and axes are dark; bars and dots are coloured
        assert len(colours) >= 3, (p["key"], colours)


def table(page, selector: str) -> list[dict[str, str]]:
    """A rendered table as dicts (header → cell text)."""
    return page.evaluate("""(sel) => { const t = document.querySelector(sel);
        const head = [...t.querySelectorAll('thead th')].map(th => th.textContent.trim());
        return [...t.querySelectorAll('tbody tr')].map(tr => Object.fromEntries(
            [...tr.children].map((td, i) => [head[i], td.textContent.trim()]))); }""", selector)


# -- the main job -------------------------------------------------------------------------------------


@pytest.mark.docker
@pytest.mark.browser
def test_report_of_the_main_job(main_job, browser, tmp_path):
    out = tmp_path / "report.html"
    code, output = run_report("--state", str(main_job.state), "--db", str(main_job.captures), "--out", str(out))
    assert code == 0, output
    state = RolloutState(main_job.state)
    try:
        results = state.all_results()
    finally:
        state.close()
    drift = drift_report(_rows(main_job.captures))

    page, plots, screenshot, requests = open_report(browser, out, tmp_path / "report.png")
    try:
        assert all(url.startswith(("file:", "data:")) for url in requests), requests  # self-contained
        assert page.locator("script").count() == 0
        assert page.evaluate("() => [...document.querySelectorAll('section')].map(s => s.id)") == SECTIONS
        for key in SECTIONS:
            assert page.locator(f"section#{key} h2").is_visible()

        expected = {"rewards", "tokens", "timings", "latency", "prefix-merge"}
        if any(r.breaks or r.reappeared_tokens < r.carried_tokens for r in drift):
            expected.add("drift")
        assert sorted(p["key"] for p in plots) == sorted(expected)
        assert_drawn(plots, screenshot)

        summary = {row[0]: row[1] for row in page.evaluate(
            "() => [...document.querySelectorAll('#summary tr')].map(tr => [...tr.children].map(c => c.textContent))")}
        assert summary["sessions"] == f"{len(results)} ({len(results)} finished)"
        rewards = [r.reward for r in results]
        assert summary["mean reward"].startswith(f"{statistics.fmean(rewards):.3f} over {len(rewards)} scored")
        trajectories = [t for r in results for t in r.trajectories]
        assert summary["trajectories"].startswith(f"{len(trajectories)} (")
        assert f"{sum(t.trainable_tokens for t in trajectories):,} sampled" in summary["tokens"]
        breaks = sum(len(r.breaks) for r in drift)
        assert summary["drift"].endswith(f"{breaks} prefix break{'' if breaks == 1 else 's'}")

        per_task = table(page, "#rewards table")
        assert {(row["harness"], row["task"]) for row in per_task} == {(main_job.harness, r.task_id) for r in results}
        assert sum(int(row["sessions"]) for row in per_task) == len(results)

        per_session = {row["session"]: row for row in table(page, "#tokens table")}
        captured = _calls_per_session(main_job.captures)
        for r in results:
            row = per_session[r.session_id]
            assert int(row["turns"]) == sum(len(t.turns) for t in r.trajectories)
            assert int(row["calls captured"]) == captured[r.session_id]
    finally:
        page.close()


@pytest.mark.docker
def test_state_only_report(main_job, tmp_path):
    out = tmp_path / "state.html"
    code, output = run_report("--state", str(main_job.state), "--out", str(out))
    assert code == 0, output
    html = out.read_text()
    assert sorted(re.findall(r'data-plot="([^"]+)"', html)) == ["prefix-merge", "rewards", "timings", "tokens"]
    assert "Rollout state only" in html and "Model-call latency needs the capture DB" in html


# -- captures only --------------------------------------------------------------------------------------


@pytest.fixture
def crafted_captures(tmp_path) -> Path:
    """Session "agent": calls 1→2 one trajectory, 3 forks after 1, 4 re-renders history (broken prefix,
    truncated) and 5 fails after it (partial). Session "solo": one call."""
    # In a worker thread: the Recorder awaits the store with asyncio.run, and Playwright's sync API
    # keeps an event loop running on this thread once the session's browser has started.
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(_craft, tmp_path / "captures.db").result()


def _craft(path: Path) -> Path:
    rec = Recorder(path)
    try:
        prompt, first = list(range(1, 41)), [100, 101, 102]
        rec.call("agent", prompt, first, conversation("fix it", 0))
        rec.call("agent", prompt + first + [50, 51], [200, 201], conversation("fix it", 1))
        rec.call("agent", prompt + first + [60, 61], [210, 211], conversation("fix it", 1, tail="user"))
        rerendered = [1, 2, 3, 4, 777, *prompt[5:], *first, 50, 51, 200, 201, 52]
        rec.call("agent", rerendered, [300, 301], conversation("fix it", 2), finish="length")
        rec.fail("agent", conversation("fix it", 3))
        rec.call("solo", [5, 6, 7, 8], [9, 10], conversation("other", 0))
    finally:
        rec.close()
    return path


@pytest.mark.browser
def test_capture_db_only_report(crafted_captures, browser, tmp_path):
    out = tmp_path / "captures.html"
    code, output = run_report("--db", str(crafted_captures), "--out", str(out))
    assert code == 0, output
    page, plots, screenshot, requests = open_report(browser, out, tmp_path / "captures.png")
    try:
        assert all(url.startswith(("file:", "data:")) for url in requests), requests
        assert sorted(p["key"] for p in plots) == ["drift", "latency", "prefix-merge", "tokens"]  # crafted calls are timed
        assert_drawn(plots, screenshot)
        assert "Needs the rollout state" in page.locator("#rewards").inner_text()
        assert "Stage timings need the rollout state" in page.locator("#timings").inner_text()

        merged = {row["session"]: row for row in table(page, "#prefix-merge table")}
        assert {k: merged["agent"][k] for k in ("trajectories", "roots", "forks", "max calls", "broken", "truncated",
                                                "partial")} == {"trajectories": "3", "roots": "2", "forks": "1",
                                                                "max calls": "2", "broken": "1", "truncated": "1",
                                                                "partial": "1"}
        assert (merged["solo"]["trajectories"], merged["solo"]["broken"]) == ("1", "0")
        lineage = table(page, "#prefix-merge table:nth-of-type(2)")
        assert [(r["fork"], r["parent"], r["fork position"]) for r in lineage] == [("agent#3", "agent#1", "43")]

        tokens = {row["session"]: row for row in table(page, "#tokens table")}
        assert (tokens["agent"]["calls captured"], tokens["agent"]["failed calls"], tokens["agent"]["turns"]) == \
            ("5", "1", "4")
        assert tokens["agent"]["sampled tokens"] == "9"  # 3 + 2 + 2 + 2 sampled ids

        breaks = table(page, "#drift table:nth-of-type(2)")
        assert [(b["session"], b["row"], b["left row"], b["position"], b["in"]) for b in breaks] == \
            [("agent", "4", "2", "4", "context of row 1")]
        # Carried: call 1's 3 sampled ids (kept by call 2 and the fork) and call 2's 2 (lost in the re-render).
        assert "3 of 5 carried sampled tokens reappeared" in page.locator("#summary").inner_text()
    finally:
        page.close()


# -- a run too large for one bar per session ---------------------------------------------------------------


@pytest.fixture
def large_run(tmp_path) -> tuple[Path, Path, int]:
    """A rollout state and capture DB of one task with 3 × PER_SESSION sessions, each one call."""
    with ThreadPoolExecutor(1) as pool:  # the Recorder's asyncio.run: see crafted_captures
        return pool.submit(_large_run, tmp_path).result()


def _large_run(tmp_path: Path) -> tuple[Path, Path, int]:
    from polar.reporting.plots import PER_SESSION
    from polar.rollout.tasks import Named, SessionResult, TaskSpec
    from polar.trajectories import prefix_merge

    n = 3 * PER_SESSION
    state = RolloutState(tmp_path / "rollout.db")
    rec = Recorder(tmp_path / "captures.db")
    try:
        sessions = state.add_task(TaskSpec(id="big", instruction="x", samples=n, harness=Named(name="codex")))
        for i, spec in enumerate(sessions):
            rec.call(spec.session_id, list(range(1, 30 + i)), list(range(500, 500 + 1 + i % 7)), conversation("x", 0))
        rows = rec.rows()
        for i, spec in enumerate(sessions):
            trajectories = prefix_merge(r for r in rows if r["session_id"] == spec.session_id)
            state.put_result(SessionResult(session_id=spec.session_id, task_id="big", sample=spec.sample,
                                           outcome="ok" if i % 5 else "timeout", reward=(i % 4) / 3,
                                           trajectories=trajectories,
                                           timings={"init": 1 + i % 3, "run": 5 + i % 11, "postrun": 2.0}))
    finally:
        rec.close()
        state.close()
    return tmp_path / "rollout.db", tmp_path / "captures.db", n


def test_large_run_plots_distributions(large_run, tmp_path):
    state, captures, n = large_run
    out = tmp_path / "large.html"
    code, output = run_report("--state", str(state), "--db", str(captures), "--out", str(out))
    assert code == 0, output
    html = out.read_text()
    figures = dict(re.findall(r'data-plot="([^"]+)">\s*<img src="data:image/png;base64,([^"]+)"', html))
    assert sorted(figures) == ["latency", "prefix-merge", "rewards", "timings", "tokens"]  # crafted calls are timed
    for key, data in figures.items():
        image = Image.open(io.BytesIO(base64.b64decode(data))).convert("RGB")
        pixels = np.asarray(image).reshape(-1, 3).astype(int)
        ink = (np.abs(pixels - 255).max(axis=1) > 40).mean()
        # Distributions keep the figure short; one bar per session would make it grow with n.
        assert 0.02 < ink and image.height < 600, (key, ink, image.size)
    summary = dict(re.findall(r"<tr>\s*<th>([^<]+)</th>\s*<td>([^<]+)</td>", html))
    assert summary["sessions"] == f"{n} ({n} finished)"
    assert summary["outcomes"] == f"ok {n - n // 5} · timeout {n // 5}"  # every fifth session timed out


def test_turns_without_logprobs_are_reported(tmp_path):
    rec = Recorder(tmp_path / "captures.db")
    try:
        prompt = list(range(1, 41))
        rec.call("agent", prompt, [100, 101], conversation("fix it", 0))
        rec.call("agent", prompt + [100, 101, 50], [200, 201], conversation("fix it", 1), no_logprobs=True)
        rec.call("solo", [5, 6, 7, 8], [9, 10], conversation("other", 0))
    finally:
        rec.close()
    out = tmp_path / "report.html"
    code, output = run_report("--db", str(rec.path), "--out", str(out))
    assert code == 0, output
    html = out.read_text()
    summary = dict(re.findall(r"<tr>\s*<th>([^<]+)</th>\s*<td>([^<]+)</td>", html))
    assert summary["logprobs"].startswith("1 of 3 turns without logprobs (the upstream returned none")
    assert summary["logprobs"].endswith("in 1 trajectory")
    tokens = re.search(r'id="tokens".*?</table>', html, re.S).group(0)
    head = re.findall(r"<th>([^<]+)</th>", tokens)
    body = [re.findall(r"<td[^>]*>([^<]+)</td>", r) for r in re.findall(r"<tr>(.*?)</tr>", tokens, re.S)[1:]]
    assert {r[0]: r[head.index("turns without logprobs")] for r in body} == {"agent": "1", "solo": "0"}

    complete = tmp_path / "complete.db"
    rec = Recorder(complete)
    try:
        rec.call("solo", [5, 6, 7, 8], [9, 10], conversation("other", 0))
    finally:
        rec.close()
    code, output = run_report("--db", str(complete), "--out", str(out))
    html = out.read_text()
    assert code == 0 and "captured for every turn (1)" in html and "turns without logprobs" not in html


# -- bad input ------------------------------------------------------------------------------------------


def test_bad_inputs_are_clear_click_errors(crafted_captures, tmp_path):
    out = tmp_path / "r.html"
    code, output = run_report("--out", str(out))
    assert code == 2 and "give --state ROLLOUT_DB, --db CAPTURES_DB, or both" in output

    code, output = run_report("--state", str(tmp_path / "missing.db"), "--out", str(out))
    assert code == 2 and "Invalid value for --state" in output and "no rollout state database at" in output
    assert not (tmp_path / "missing.db").exists()  # nothing created on the way

    text = tmp_path / "notes.txt"
    text.write_text("not a database\n" * 100)
    code, output = run_report("--db", str(text), "--out", str(out))
    assert code == 2 and "Invalid value for --db" in output and "is not a polar capture database" in output

    other = tmp_path / "other.db"
    with sqlite3.connect(other) as conn:
        conn.execute("CREATE TABLE things (id INTEGER PRIMARY KEY, name TEXT)")
    conn.close()
    code, output = run_report("--db", str(other), "--out", str(out))
    assert code == 2 and "is not a polar capture database (missing: calls(" in output
    code, output = run_report("--state", str(other), "--out", str(out))
    assert code == 2 and "is not a polar rollout state database (missing: results(" in output
    with sqlite3.connect(other) as conn:  # read only: no table was added to someone else's database
        assert [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")] == ["things"]
    conn.close()

    code, output = run_report("--state", str(crafted_captures), "--out", str(out))
    assert code == 2 and "is not a polar rollout state database; it is a capture database" in output
    assert not out.exists()


def _rows(captures: Path) -> list[dict]:
    from polar.capture.reader import CaptureReader

    store = CaptureReader(captures)
    return list(store.calls())


def _calls_per_session(captures: Path) -> dict[str, int]:
    counts: dict[str, int] = {}
    for row in _rows(captures):
        counts[row["session_id"]] = counts.get(row["session_id"], 0) + 1
    return counts
