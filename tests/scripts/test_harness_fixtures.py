"""data/harness_requests: the six CLIs' and the four agents' recorded requests carry no secret and parse as their
provider's format."""

from __future__ import annotations

import json
import platform
import re
from urllib.parse import parse_qsl, urlsplit

import pytest

from polar.harnesses import AGENTS, CLIS
from polar.providers import ProviderSet, Sealer
from tests.conftest import REPO

FIXTURES = REPO / "data" / "harness_requests"
AUTH_HEADERS = {"authorization", "x-api-key", "x-goog-api-key", "api-key", "cookie", "proxy-authorization"}
KEYS = re.compile(r"(?<![A-Za-z])sk-[A-Za-z0-9_-]{6,}|AIza[0-9A-Za-z_-]{6,}|Bearer\s+\S|polar-record-")
UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", re.I)
LONG_HEX = re.compile(r"(?<![0-9a-f])[0-9a-f]{32,}(?![0-9a-f])", re.I)


def load(cli: str) -> dict:
    return json.loads((FIXTURES / f"{cli}.json").read_text())


RECORDED = (*CLIS, *AGENTS)
STREAMED = {"mini_swe_agent": False, "openhands": False}  # through LiteLLM, not streamed; every other one streams


@pytest.mark.parametrize("harness", RECORDED, ids=lambda h: h.name)
def test_fixture_has_no_secrets(harness):
    text = (FIXTURES / f"{harness.name}.json").read_text()
    data = json.loads(text)
    for turn in ("first", "later"):
        assert not AUTH_HEADERS & {h.lower() for h in data[turn]["headers"]}, data[turn]["headers"]
    assert not KEYS.findall(text)
    assert platform.release() not in text  # the kernel of the machine that recorded it
    # Ids are the stable placeholders: counters in zeros, never a random (or per-machine) one.
    assert all(u.startswith("00000000-0000-4000-8000-") for u in UUID.findall(text)), UUID.findall(text)[:3]
    assert all(h.lstrip("0") and len(h.lstrip("0")) < 8 for h in LONG_HEX.findall(text))


@pytest.mark.parametrize("harness", RECORDED, ids=lambda h: h.name)
def test_fixture_parses_as_its_provider(harness):
    """polar's own detection routes both requests to the CLI's provider, which parses them: the first holds the
    task and the tools, the later one the tool call and its result."""
    data = load(harness.name)
    assert (data["provider"], data["cli"], data["version"]) == (harness.provider, harness.name, harness.version)
    providers = ProviderSet(Sealer(b"0" * 32))
    parsed = []
    for turn in ("first", "later"):
        url = urlsplit(data[turn]["path"])
        route = providers.detect("POST", url.path, dict(parse_qsl(url.query)), data[turn]["headers"])
        assert route is not None and route.provider.name == harness.provider, (turn, data[turn]["path"])
        assert len(data[turn]["body"]) and data[turn]["body_bytes"] > 1000
        parsed.append(route.provider.parse(route, data[turn]["body"]).request)
    first, later = parsed
    assert first.tools and data["marker"] in json.dumps(first.messages, default=str)
    assert len(later.messages) > len(first.messages)
    assert data["shell_tool"] in {tool.name for tool in first.tools}  # what the benchmark's model calls
    assert data["stream"] is STREAMED.get(harness.name, True)
