"""A fleet of scripted vLLM doubles (TEST DOUBLES, each a process of its own: polar/doubles/) behind one
real polar proxy, driven by the official OpenAI SDK: sessions stay on their replica and extend token for
token, new sessions spread or join their task's replica, a call a replica fails before its client saw
anything is answered by another, a replica killed mid-run loses no capture and no session, and one that
comes back is taken in again. The same on two real vLLM servers: tests/integration/test_fleet_real_vllm.py."""

from __future__ import annotations

import threading
import time

import openai
import pytest

from polar.capture.reader import CaptureReader
from polar.mitm.proxy import ProxyConfig, SubprocessProxy, free_port
from tests.support.replicas import DoubleProcess, InProcessDouble

pytestmark = pytest.mark.slow  # outside scripts/test_fast: processes killed and restarted, or many started


class Fleet:
    def __init__(self, doubles: list[DoubleProcess | InProcessDouble], proxy: SubprocessProxy, db):
        self.doubles, self.proxy, self.db = doubles, proxy, db
        self.client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="sk-test", max_retries=0, timeout=60)

    def rows(self, session: str | None = None) -> list[dict]:
        return list(CaptureReader(self.db).calls(session=session))

    def ask(self, session: str, messages: list[dict], stream: bool = False) -> tuple[str, str]:
        """One turn: (the answer's text, its call id)."""
        headers = {"x-polar-session": session}
        if not stream:
            raw = self.client.chat.completions.with_raw_response.create(
                model="polar-tiny", messages=messages, max_tokens=24, extra_headers=headers)
            return raw.parse().choices[0].message.content or "", raw.headers["x-polar-call-id"]
        with self.client.chat.completions.with_streaming_response.create(
                model="polar-tiny", messages=messages, max_tokens=24, stream=True, extra_headers=headers) as raw:
            text = "".join(chunk.choices[0].delta.content or "" for chunk in raw.parse() if chunk.choices)
            return text, raw.headers["x-polar-call-id"]

    def session(self, name: str, first: str, turns: int, stream: bool = False) -> list[str]:
        messages = [{"role": "user", "content": first}]
        ids = []
        for turn in range(turns):
            text, call_id = self.ask(name, messages, stream)
            ids.append(call_id)
            messages += [{"role": "assistant", "content": text}, {"role": "user", "content": f"and then {turn}?"}]
        return ids


@pytest.fixture(scope="module")
def fleet(tokenizer_dir, double_server, tmp_path_factory):
    killable = DoubleProcess(tokenizer_dir)  # the one the kill test kills: a process of its own
    killable.launch()
    doubles = [InProcessDouble(url=double_server[1]), InProcessDouble(tokenizer_dir), killable]
    killable.wait_ready()
    db = tmp_path_factory.mktemp("fleet") / "captures.db"
    proxy = SubprocessProxy(ProxyConfig(upstream=",".join(d.url for d in doubles), db=str(db), port=free_port(),
                                        tokenizer=str(tokenizer_dir), extra={"polar_upstream_timeout": 20}))
    proxy.start()
    yield Fleet(doubles, proxy, db)
    proxy.stop()
    for double in doubles:
        double.kill()


def _assert_extends(rows: list[dict]) -> None:
    """Each ok turn's prompt is the last ok turn's prompt + its sampled ids + the new messages' ids."""
    ok = [r for r in rows if r["status"] == "ok"]
    for before, after in zip(ok, ok[1:]):
        held = before["prompt_ids"] + before["completion_ids"]
        assert after["prompt_ids"][:len(held)] == held, (before["call_id"], after["call_id"])
        assert after["prompt_mode"].startswith("token-faithful"), after["prompt_mode"]


def test_sessions_stay_on_their_replica_and_new_ones_spread_or_join_their_task(fleet):
    for n in range(6):
        fleet.session(f"spread-{n}", f"Task {n}: list the files.", 3)
    homes = {}
    for n in range(6):
        rows = fleet.rows(f"spread-{n}")
        assert len(rows) == 3 and {r["status"] for r in rows} == {"ok"}
        assert len({r["replica"] for r in rows}) == 1, [r["replica"] for r in rows]
        _assert_extends(rows)
        homes[n] = rows[0]["replica"]
    assert set(homes.values()) == {d.url for d in fleet.doubles}  # six new sessions over three idle replicas
    # More samples of task 2: where its prefix is cached.
    for k in range(3):
        fleet.session(f"sample-{k}", "Task 2: list the files.", 1)
        assert fleet.rows(f"sample-{k}")[0]["replica"] == homes[2]


def test_a_call_a_replica_fails_before_answering_is_answered_by_another_and_the_replica_comes_back(fleet):
    fleet.session("retry", "Task retry: count to three.", 1)
    (first,) = fleet.rows("retry")
    failing = next(d for d in fleet.doubles if d.url == first["replica"])
    failing.post("fault", {"mode": "status", "status": 500, "count": 1})
    messages = [{"role": "user", "content": "Task retry: count to three."}]
    text, call_id = fleet.ask("retry", messages + [{"role": "assistant", "content": "x"}, {"role": "user", "content": "go"}])
    row = fleet.rows("retry")[-1]
    assert row["call_id"] == call_id and row["status"] == "ok" and row["replica"] != failing.url
    assert row["result"]["failovers"][0].startswith(f"{failing.url}: upstream_error")
    # Streamed, broken off before its first token: moved too, the client never knows.
    failing_2 = next(d for d in fleet.doubles if d.url == row["replica"])
    failing_2.post("fault", {"mode": "die_mid_stream", "after_tokens": 0, "count": 1})
    text, call_id = fleet.ask("retry", messages, stream=True)
    row = fleet.rows("retry")[-1]
    assert text and row["status"] == "ok" and row["replica"] not in (failing.url, failing_2.url)
    assert row["result"]["failovers"][0].startswith(f"{failing_2.url}: ")
    # Both answered /health all along: probed and taken back in; new sessions (fewer held there) reach them.
    reached: set[str] = set()
    deadline = time.monotonic() + 30
    n = 0
    while {failing.url, failing_2.url} - reached and time.monotonic() < deadline:
        fleet.session(f"back-{n}", f"Task back {n}", 1)
        reached.add(fleet.rows(f"back-{n}")[0]["replica"])
        n += 1
        time.sleep(0.3)
    assert {failing.url, failing_2.url} <= reached


def test_a_stream_that_already_sent_text_gets_the_error_and_its_row_names_the_replica(fleet):
    fleet.session("broken", "Task broken: say a long sentence.", 1)
    home = fleet.rows("broken")[0]["replica"]
    double = next(d for d in fleet.doubles if d.url == home)
    double.post("fault", {"mode": "die_mid_stream", "after_tokens": 10, "count": 1})
    with pytest.raises(openai.APIError):
        fleet.ask("broken", [{"role": "user", "content": "Task broken: say a long sentence."}], stream=True)
    row = fleet.rows("broken")[-1]
    assert row["status"] == "error" and row["replica"] == home and row["error_kind"] == "upstream_error"
    assert row["completion_ids"]  # what was sampled before the break is kept


def test_a_replica_killed_mid_run_loses_no_session_and_no_capture(fleet):
    for double in fleet.doubles:
        double.post("pace", {"token_delay_s": 0.02})
    errors: dict[str, list[str]] = {}
    done: dict[str, int] = {}
    kill_at: list[float] = []

    def run(name: str) -> None:
        messages = [{"role": "user", "content": f"Kill task {name}: explain."}]
        errors[name], done[name] = [], 0
        for turn in range(5):
            while True:  # as a harness does: a failed call is made again
                try:
                    text, _ = fleet.ask(name, messages, stream=turn % 2 == 0)
                    break
                except openai.APIError as exc:
                    errors[name].append(str(exc))
                    assert len(errors[name]) < 3, errors[name]
            messages += [{"role": "assistant", "content": text}, {"role": "user", "content": f"next {turn}"}]
            done[name] += 1

    names = [f"kill-{n}" for n in range(6)]
    threads = [threading.Thread(target=run, args=(name,)) for name in names]
    for thread in threads:
        thread.start()
    victim = next(d for d in fleet.doubles if isinstance(d, DoubleProcess))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # until it has served some session's first turn
        if any(r["session_id"] in names and r["replica"] == victim.url for r in fleet.rows()):
            break
        time.sleep(0.1)
    time.sleep(0.3)  # (and is in the middle of more)
    kill_at.append(time.time())
    victim.kill()
    for thread in threads:
        thread.join(120)
    try:
        assert done == {name: 5 for name in names}, (done, errors)
        for name in names:
            rows = fleet.rows(name)
            ok = [r for r in rows if r["status"] == "ok"]
            assert len(ok) == 5
            _assert_extends(rows)
            assert all(r["replica"] != victim.url for r in ok if r["t_start"] > kill_at[0] + 1)
            for row in rows:
                if row["status"] != "ok":  # only calls in flight at the kill
                    assert row["t_start"] < kill_at[0] < row["t_end"] and row["replica"] == victim.url, row
        assert not [r for r in fleet.rows() if r["status"] == "pending"]
    finally:
        # Started again on its port: probed and taken back in.
        restarted = DoubleProcess(victim.tokenizer_dir, port=victim.port)
        restarted.launch()
        restarted.wait_ready()
        fleet.doubles[fleet.doubles.index(victim)] = restarted
    reached = set()
    deadline = time.monotonic() + 30
    n = 0
    while victim.url not in reached and time.monotonic() < deadline:
        fleet.session(f"after-{n}", f"Task after {n}", 1)
        reached.add(fleet.rows(f"after-{n}")[0]["replica"])
        n += 1
        time.sleep(0.3)
    assert victim.url in reached


def test_the_report_shows_each_replica_s_share(fleet, tmp_path):
    from polar.reporting import write_report

    data = write_report(tmp_path / "report.html", None, fleet.db)
    rows = fleet.rows()
    by_url = {r.replica: r for r in data.replicas}
    assert set(by_url) == {d.url for d in fleet.doubles}
    assert sum(r.calls for r in data.replicas) == len(rows)
    assert sum(r.failed_over for r in data.replicas) == sum(len(r["result"]["failovers"]) for r in rows
                                                            if isinstance(r.get("result"), dict))
    assert sum(r.failed_over for r in data.replicas) >= 2 and sum(r.failed for r in data.replicas) >= 1
    html = (tmp_path / "report.html").read_text()
    assert "Fleet replicas" in html and all(url in html for url in by_url)
