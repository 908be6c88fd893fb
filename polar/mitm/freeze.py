"""Out of the collector's sight once polar runs: what start-up built (mitmproxy, transformers, the template, some
200k objects) lives as long as the process, yet each full collection walked it again, triggered by the objects
an agent-sized request decodes to."""

from __future__ import annotations

import gc


class FreezeAddon:
    """Last in polar's chain: its `running` comes after every other addon's start-up work."""

    def running(self) -> None:
        gc.freeze()
