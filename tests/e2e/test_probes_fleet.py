"""Probes through a fleet (several upstreams behind one polar): the listing carries the replicas' window, no row."""

from __future__ import annotations

import openai

from tests.upstream.test_fleet_doubles import fleet  # noqa: F401


def test_the_fleet_listing_carries_the_window(fleet):  # noqa: F811
    client = openai.OpenAI(base_url=f"{fleet.proxy.url}/v1", api_key="sk", max_retries=0,
                           default_headers={"x-polar-session": "probe-fleet"})
    (card,) = client.models.list().data
    assert card.model_extra["max_model_len"] == 32768  # each double's window (polar double's default)
    assert fleet.rows("probe-fleet") == []
