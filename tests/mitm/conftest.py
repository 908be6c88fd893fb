"""mitmproxy keeps its master and options in a module-global context (`mitmproxy.ctx`); a master a test
builds would take it over from the session-wide in-process proxy other tests use. Saved and put back."""

from __future__ import annotations

import pytest
from mitmproxy import ctx


@pytest.fixture(autouse=True)
def mitmproxy_context():
    saved = {name: getattr(ctx, name) for name in ("master", "options", "log") if hasattr(ctx, name)}
    yield
    for name, value in saved.items():
        setattr(ctx, name, value)
