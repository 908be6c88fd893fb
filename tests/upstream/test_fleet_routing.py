"""Fleet routing (polar/upstream/fleet/routing.py) on its own: affinity, placement by prefix, the imbalance
bound on in-flight tokens, failed replicas, and the routing keys taken from real canonical requests."""

from __future__ import annotations

import pytest

from polar.canonical import ChatRequest, Message, TextPart, Tool
from polar.upstream.fleet.replicas import Replica, upstream_urls
from polar.upstream.fleet.routing import CallShape, Router, call_shape


def _fleet(n: int, imbalance: float = 1.5) -> tuple[list[Replica], Router]:
    replicas = [Replica(f"http://r{i}", backend=None) for i in range(n)]  # routing never calls a backend
    return replicas, Router(replicas, imbalance)


def _request(system: str | None, first: str, *more: str, tools: tuple[str, ...] = ("run",)) -> ChatRequest:
    messages = ([Message(role="system", content=[TextPart(text=system)])] if system else []) + [
        Message(role="user", content=[TextPart(text=text)]) for text in (first, *more)]
    return ChatRequest(model="m", messages=messages, tools=[Tool(name=t, parameters={"type": "object"}) for t in tools])


def test_a_session_stays_on_its_replica_while_it_is_in_and_not_overloaded():
    replicas, router = _fleet(3)
    shape = CallShape("s1", ("p",), 1000)
    first = router.place(shape)
    assert first.why == "least-loaded"
    for _ in range(5):
        assert router.place(shape) == type(first)(first.replica, "affinity")
    # Another session's call in flight on it is no reason to leave (one call's slack).
    first.replica.hold(1000)
    assert router.place(shape).replica is first.replica
    # Overloaded past the bound: 1.5 x the mean (10000 / 3) + its own 1000 tokens.
    first.replica.hold(9000)
    moved = router.place(shape)
    assert moved.why == "moved" and moved.replica is not first.replica
    assert router.place(shape).replica is moved.replica  # and stays there from then on


def test_a_session_whose_replica_is_out_moves_and_a_returning_replica_gets_new_sessions():
    replicas, router = _fleet(2)
    home = router.place(CallShape("s1", (), 10)).replica
    home.take_out("connection refused")
    other = router.place(CallShape("s1", (), 10))
    assert other.why == "moved" and other.replica is not home
    home.take_in()
    assert router.place(CallShape("s1", (), 10)).replica is other.replica  # its cache is on the other now
    assert router.place(CallShape("s2", (), 10)).replica is home  # holds fewer sessions: the new one goes there
    assert home.readmitted == 1 and home.failures == 1
    home.take_out("gone")
    home.take_out("still gone")
    assert home.failures == 2 and home.last_error == "still gone"
    replicas[1].take_out("gone too")
    assert router.place(CallShape("s3", (), 10)) is None


def test_new_sessions_go_where_their_prefix_is_unless_that_replica_is_loaded_beyond_the_bound():
    replicas, router = _fleet(4)
    task = ("task-7", "harness")
    first = router.place(CallShape("a", task, 500)).replica
    # Samples of the same task, one after another: all where the first one's prefix is cached.
    assert {router.place(CallShape(f"b{i}", task, 500)).replica for i in range(5)} == {first}
    # Same system prompt and tools, another task: not onto a replica already holding more than 1.5 x the mean
    # number of sessions; the next one finds the harness where that one went.
    other = router.place(CallShape("c", ("task-8", "harness"), 500))
    assert other.why == "least-loaded" and other.replica is not first
    assert router.place(CallShape("c2", ("task-9", "harness"), 500)) == type(other)(other.replica, "prefix")
    # A slow trickle of tasks of one harness (nothing in flight): sessions stay within the bound too.
    for i in range(40):
        router.place(CallShape(f"t{i}", (f"trickle-{i}", "harness"), 500))
    held = router.sessions_on()
    assert max(held.values()) <= 1.5 * sum(held.values()) / 4 + 1, held
    # All launched at once (each call in flight while the next is placed): the bound spreads them.
    holds = []
    placed = []
    for i in range(12):
        p = router.place(CallShape(f"d{i}", ("task-10", "harness"), 1000))
        placed.append(p.replica)
        holds.append(p.replica.hold(1000))
    loads = sorted(r.load for r in replicas)
    assert len(set(placed)) == 4 and loads[-1] <= 1.5 * sum(loads) / 4 + 1000
    for held in holds:
        held.release()
    assert all(r.load == 0 and r.in_flight == 0 for r in replicas)


def test_the_least_loaded_is_by_in_flight_tokens_not_by_calls():
    replicas, router = _fleet(2, imbalance=1.0)
    for _ in range(5):
        replicas[0].hold(10)  # five small calls
    replicas[1].hold(5000)  # one long prompt
    assert router.place(CallShape("new", (), 10)).replica is replicas[0]


def test_the_imbalance_bound_is_a_factor_of_at_least_one():
    with pytest.raises(ValueError, match="at least 1"):
        Router([], imbalance=0.5)


def test_routing_keys_name_the_task_and_the_harness_from_the_request():
    task = call_shape(_request("You are an agent.", "Fix bug 7"), None)
    sample = call_shape(_request("You are an agent.", "Fix bug 7"), None)
    other_task = call_shape(_request("You are an agent.", "Fix bug 8"), None)
    other_tools = call_shape(_request("You are an agent.", "Fix bug 7", tools=("run", "edit")), None)
    assert task.prefixes == sample.prefixes and len(task.prefixes) == 2
    assert task.prefixes[0] != other_task.prefixes[0] and task.prefixes[1] == other_task.prefixes[1]
    assert not set(task.prefixes) & set(other_tools.prefixes)  # tools are part of the cached prefix
    no_system = call_shape(_request(None, "hello"), None)
    assert len(no_system.prefixes) == 1 and no_system.session is None
    assert task.tokens > 64


def test_upstream_urls_from_options_and_a_file(tmp_path):
    listing = tmp_path / "fleet.txt"
    listing.write_text("# node 1\nhttp://10.0.0.1:8000\nhttp://10.0.0.2:8000/  # second\n\nhttp://10.0.0.1:8000\n")
    assert upstream_urls(["http://a:1,http://b:2", "http://c:3"], listing) == [
        "http://a:1", "http://b:2", "http://c:3", "http://10.0.0.1:8000", "http://10.0.0.2:8000"]
    assert upstream_urls(["http://a:1"]) == ["http://a:1"]
    with pytest.raises(ValueError, match="not 'a:1'"):
        upstream_urls(["a:1"])
