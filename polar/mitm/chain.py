"""polar's addons, one per concern, in the order mitmproxy calls them. `polar proxy` and the mitmproxy script
(`mitmdump -s addons/polar_gateway.py`) load this same list."""

from __future__ import annotations

from typing import Any

from polar.mitm.addon import GatewayAddon
from polar.mitm.backlog import BacklogAddon
from polar.mitm.contentview import ContentviewAddon
from polar.mitm.freeze import FreezeAddon
from polar.mitm.relay import RelayAddon
from polar.mitm.shutdown import DrainAddon


def polar_addons() -> list[Any]:
    """A fresh chain, the gateway addon first. Its `done` runs before the relay's would: the calls in flight are
    ended (and the relay stopped) before anything closes."""
    relay = RelayAddon()
    gateway = GatewayAddon(relay.relay)
    return [gateway, relay, ContentviewAddon(gateway), DrainAddon(gateway), BacklogAddon(), FreezeAddon()]
