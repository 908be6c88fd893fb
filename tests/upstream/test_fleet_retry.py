"""The fleet's retry-once rule on its own, with in-process backends (TEST DOUBLES that fail on cue): a call
whose client saw nothing moves once; one that streamed text does not; a refusal of the request itself moves
nothing and takes no replica out. End to end against scripted vLLM processes: test_fleet_doubles.py."""

from __future__ import annotations

import asyncio

import pytest

from polar.canonical import ChatRequest, ChatResult, Message, TextDelta, TextPart
from polar.errors import GatewayError
from polar.sessions.state import SessionState, SessionView
from polar.upstream.fleet.backend import FleetBackend


class Stream:
    def __init__(self, name: str, fail_accept: str | None, fail_after: int | None):
        self.name, self.fail_accept, self.fail_after, self.closed = name, fail_accept, fail_after, False

    prompt_tokens = 3

    async def accepted(self, timeout):
        if self.fail_accept:
            raise GatewayError(self.fail_accept, f"{self.name} refused")
        return True

    async def __aiter__(self):
        for n in range(3):
            if self.fail_after is not None and n == self.fail_after:
                raise GatewayError("upstream_error", f"{self.name} broke off")
            yield [TextDelta(f"{self.name}{n} ")]

    def result(self):
        return ChatResult(id="c", model="m", created=0, content=self.name)

    partial = result

    async def aclose(self):
        self.closed = True


class Replica:
    """Its next streams fail as scripted (a list of (fail_accept, fail_after), then healthy ones)."""

    def __init__(self, name: str, script=()):
        self.name, self.script, self.streams = name, list(script), []

    async def stream(self, request, call_id, session=None):
        fail_accept, fail_after = self.script.pop(0) if self.script else (None, None)
        self.streams.append(Stream(self.name, fail_accept, fail_after))
        return self.streams[-1]

    async def complete(self, request, call_id, session=None):
        fail_accept, _ = self.script.pop(0) if self.script else (None, None)
        if fail_accept:
            raise GatewayError(fail_accept, f"{self.name} refused")
        return ChatResult(id=call_id, model="m", created=0, content=self.name)

    def template_traits(self):
        return None

    async def aclose(self):
        pass


REQUEST = ChatRequest(model="m", messages=[Message(role="user", content=[TextPart(text="hi")])])


async def _drain(stream) -> str:
    await stream.accepted(None)
    return "".join([d.text async for deltas in stream for d in deltas])


def _fleet(*replicas) -> FleetBackend:
    return FleetBackend([(f"http://{r.name}", r) for r in replicas], probe_interval=60)


def test_a_stream_refused_or_broken_before_any_text_moves_once():
    async def scenario():
        a, b = Replica("a", [("upstream_unavailable", None)]), Replica("b", [(None, 0)])
        fleet = _fleet(a, b)
        stream = await fleet.stream(REQUEST, "c1", SessionView(SessionState(), [], "s"))
        with pytest.raises(GatewayError) as err:  # refused by a, moved to b, broken by b before its first text
            await _drain(stream)
        assert err.value.replica == "http://b" and a.streams[0].closed
        assert [r.up for r in fleet.replicas] == [False, False]  # both failed: both out
        assert stream.partial().replica == "http://b" and stream.partial().failovers[0].startswith("http://a: ")
        await stream.aclose()
        assert all(r.in_flight == 0 and r.load == 0 for r in fleet.replicas)
        await fleet.aclose()

        a, b = Replica("a", [(None, 0)]), Replica("b")
        fleet = _fleet(a, b)
        stream = await fleet.stream(REQUEST, "c2", SessionView(SessionState(), [], "s"))
        assert await _drain(stream) == "b0 b1 b2 "  # the client never learns a broke off
        assert stream.result().replica == "http://b" and not fleet.replicas[0].up
        await stream.aclose()
        await fleet.aclose()

    asyncio.run(scenario())


def test_a_stream_that_sent_text_ends_with_the_error_and_its_replica_goes_out():
    async def scenario():
        a, b = Replica("a", [(None, 2)]), Replica("b")
        fleet = _fleet(a, b)
        stream = await fleet.stream(REQUEST, "c", SessionView(SessionState(), [], "s"))
        seen = []
        with pytest.raises(GatewayError) as err:
            await stream.accepted(None)
            async for deltas in stream:
                seen += [d.text for d in deltas]
        assert seen == ["a0 ", "a1 "] and err.value.replica == "http://a" and b.streams == []
        assert not fleet.replicas[0].up and stream.partial().replica == "http://a"
        await stream.aclose()
        await fleet.aclose()

    asyncio.run(scenario())


def test_a_refusal_of_the_request_itself_moves_nothing():
    async def scenario():
        a, b = Replica("a", [("context_length", None)]), Replica("b")
        fleet = _fleet(a, b)
        with pytest.raises(GatewayError) as err:
            await fleet.complete(REQUEST, "c", SessionView(SessionState(), [], "s"))
        assert err.value.kind == "context_length" and err.value.replica == "http://a"
        assert all(r.up for r in fleet.replicas) and fleet.replicas[1].calls == 0
        result = await fleet.complete(REQUEST, "c", SessionView(SessionState(), [], "s"))  # the session stays
        assert result.replica == "http://a" and result.failovers == []
        await fleet.aclose()

    asyncio.run(scenario())
