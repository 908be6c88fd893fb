#!/usr/bin/env python3
"""A benchmark reference: mitmproxy as `polar proxy` runs it (polar's `LeanMaster`), with a one-job addon
in place of polar's — the floor under polar's small-call path, measured beside it by bench_proxy.py --floor.

  --mode answer  every call is answered from memory (the upstream's answer to the first such call): what
                 mitmproxy itself costs a call that an addon answers — no upstream, no translation, no capture;
  --mode relay   every call's body is sent on to the upstream over polar's own pooled upstream connections
                 (polar/upstream/h1.py) and its answer returned: what polar's path pays before polar's own
                 work (detect, translate, session, capture). A streamed answer is passed on whole once the
                 upstream has ended it (polar streams it as it comes).

    python scripts/bench_floor_proxy.py --port 8090 --upstream http://127.0.0.1:8000 --mode relay
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from mitmproxy import http, options

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from polar.mitm.master import LeanMaster  # noqa: E402
from polar.mitm.proxy import ProxyConfig  # noqa: E402
from polar.upstream.h1 import Pool  # noqa: E402


class Floor:
    """Answers each call: from memory (`answer`) or with the upstream's answer to its body (`relay`)."""

    def __init__(self, upstream: str, mode: str):
        self.upstream, self.mode = upstream.rstrip("/"), mode
        self.pool: Pool | None = None
        self.remembered: dict[tuple[str, str, bytes], tuple[int, bytes, str]] = {}  # by method, path, body

    async def request(self, flow: http.HTTPFlow) -> None:
        key = (flow.request.method, flow.request.path, flow.request.content or b"")
        if self.mode == "answer" and key in self.remembered:
            status, body, ctype = self.remembered[key]
        else:
            if self.pool is None:  # made on the proxy's event loop
                self.pool = Pool(self.upstream)
            status, body = await self.pool.fetch(flow.request.method, flow.request.path, flow.request.content, 600)
            ctype = "text/event-stream" if body.startswith(b"data:") else "application/json"
            if self.mode == "answer" and status == 200:
                self.remembered[key] = (status, body, ctype)
        flow.response = http.Response.make(status, body, {"content-type": ctype})

    async def done(self) -> None:
        if self.pool is not None:
            await self.pool.close()


async def serve(port: int, upstream: str, mode: str) -> None:
    opts = options.Options()
    master = LeanMaster(opts)
    master.addons.add(Floor(upstream, mode))
    opts.update(**ProxyConfig(upstream=upstream, port=port).mitm_options())  # as `polar proxy` sets mitmproxy up
    await master.run()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--upstream", required=True, help="base URL of the upstream (scripts/bench_upstream.py)")
    ap.add_argument("--mode", choices=["answer", "relay"], required=True)
    args = ap.parse_args()
    asyncio.run(serve(args.port, args.upstream, args.mode))


if __name__ == "__main__":
    main()
