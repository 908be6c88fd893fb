#!/usr/bin/env python3
"""Record each real harness's model requests as fixtures: data/harness_requests/<cli>.json.

Each of the six CLIs (polar/harnesses CLIS) and the four agents (AGENTS: OpenClaw, Hermes Agent, mini-swe-agent,
OpenHands) runs once, unchanged, in its Docker sandbox on the one-bug task of the CLI tests
(polar/harnesses/bugfix.py): polar listens transparently where the sandbox thinks the provider is (the agents
are given polar's URL, as a rollout session gives it), in front of the scripted vLLM double, so the session has
its real first request, a tool-call turn or two and a final turn. polar's capture database holds each request body byte for byte
and its (already redacted) headers; this script keeps two calls of the main conversation — the first
and the last (the one carrying the tool results) — with the headers that shape a request, secrets and
machine-specific values replaced by stable placeholders (`Scrubber`).

    python scripts/record_harness_requests.py [--cli claude_code codex ...] [--out data/harness_requests]

Needs Docker and the CLIs' cached images/npm installs (what tests/harnesses uses); about a minute a CLI.
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from polar.harnesses import AGENTS, CLIS, Harness, bugfix  # noqa: E402
from polar.harnesses.base import session_key  # noqa: E402

OUT = REPO / "data" / "harness_requests"
DEFAULT_TOKENIZER = Path.home() / ".cache" / "polar" / "models" / "qwen35-tiny"
# The provider API each polar provider name speaks, as fixtures and the replay benchmark name them.
APIS = {"anthropic": "Anthropic Messages", "openai_chat": "OpenAI Chat Completions",
        "openai_responses": "OpenAI Responses", "gemini": "Google generateContent"}
# Headers that change how a provider reads a request (versions, betas, the client's identity); every
# other header (auth, cookies, lengths, hosts, tracing and per-machine ids) is left out.
KEEP_HEADERS = ("content-type", "accept", "anthropic-version", "anthropic-beta", "openai-beta", "user-agent",
                "x-app", "x-stainless-lang", "x-stainless-package-version", "x-stainless-runtime",
                "x-stainless-helper-method", "x-goog-api-client", "originator", "version")
# Not inside a longer hex run, but inside a prefixed id too ("msg_<uuid>").
UUID = re.compile(r"(?<![0-9a-f])[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}(?![0-9a-f])", re.I)
LONG_HEX = re.compile(r"(?<![0-9a-f])[0-9a-f]{32,}(?![0-9a-f])", re.I)  # account and device hashes
MARKER = "polar-task-record-{cli}"  # the session's task marker, kept: the benchmark's script matches it


def session_name(harness: Harness) -> str:
    return f"record-{harness.name.replace('_', '-')}"


class Scrubber:
    """Stable placeholders for what must not leave this machine: ids in order of appearance (the same id
    gets the same placeholder), the session's API key, the host kernel and container names."""

    def __init__(self, harness: Harness, session: str, container_names: list[str], marker: str, polar_host: str = ""):
        key = harness.env(session)
        self.literal = {v: "<api-key>" for k, v in key.items() if k.endswith("_KEY")}
        self.literal[session_key("sk-", session)] = "<api-key>"  # the key a base-URL agent is launched with
        if polar_host:
            self.literal[polar_host] = "<polar-host>"  # the sandbox network's gateway: a per-run address
        self.literal[platform.release()] = "<kernel-release>"
        # A container named after the session is no secret, and the task's marker names it too.
        self.literal |= {name: "<hostname>" for name in container_names if name and name not in marker}
        self.ids: dict[str, str] = {}

    def _id(self, match: re.Match) -> str:
        value = match.group(0).lower()
        if value not in self.ids:
            n = len(self.ids) + 1
            self.ids[value] = (f"00000000-0000-4000-8000-{n:012d}" if "-" in value else f"{n:064x}")
        return self.ids[value]

    def text(self, value: str) -> str:
        for secret, placeholder in self.literal.items():
            value = value.replace(secret, placeholder)
        return LONG_HEX.sub(self._id, UUID.sub(self._id, value))


def pick(rows: list[dict[str, Any]], marker: str) -> tuple[dict, dict]:
    """The main conversation's first and last calls: the last model call of the run, and the earliest
    call that carries the task and the same tools (side calls, e.g. a title, declare none)."""
    calls = [r for r in rows if r["endpoint"] == "generate" and r["status"] == "ok"]
    last = calls[-1]
    tools = _tools(last)
    first = next(r for r in calls if marker.encode() in r["request_body"] and _tools(r) == tools)
    if first is last:
        raise RuntimeError(f"only one call of the main conversation was captured: {[r['path'] for r in calls]}")
    return first, last


def _tools(row: dict[str, Any]) -> str:
    return json.dumps(json.loads(row["request_body"]).get("tools"), sort_keys=True)


def _host(row: dict[str, Any]) -> str:
    headers = {k.lower(): v for k, v in (row["request_headers"] or {}).items()}
    return headers.get("host") or headers.get(":authority") or ""


def request_of(row: dict[str, Any], scrub: Scrubber) -> dict[str, Any]:
    raw = row["request_body"].decode()
    headers = {k.lower(): v for k, v in (row["request_headers"] or {}).items()}
    return {"path": scrub.text(row["path"]),
            "headers": {k: scrub.text(headers[k]) for k in KEEP_HEADERS if k in headers},
            "body_bytes": len(row["request_body"]), "body": json.loads(scrub.text(raw))}


def fixture(harness: Harness, rows: list[dict[str, Any]], scrub: Scrubber, marker: str) -> dict[str, Any]:
    first, last = pick(rows, marker)
    requests = [request_of(first, scrub), request_of(last, scrub)]
    return {
        "cli": harness.name, "package": harness.package, "version": harness.version, "provider": harness.provider,
        "api": APIS[harness.provider], "stream": bool(first["stream"]), "host": scrub.text(_host(first)),
        "marker": marker, "shell_tool": harness.shell_tool("{command}")["name"],
        "calls_in_session": len(rows), "first": requests[0], "later": requests[1],
        "note": "recorded by scripts/record_harness_requests.py; ids, keys, host names and kernel release "
                "replaced by placeholders",
    }


# -- running the CLIs ----------------------------------------------------------------------------------


def start_polar(stack: ExitStack, work: Path, tokenizer: Path) -> Any:
    """The scripted double and an in-process token-faithful polar in front of it (tests/conftest.py's stack)."""
    from polar.doubles.running import BackgroundServer
    from polar.doubles.scripted_vllm import ScriptedVLLM
    from polar.mitm.proxy import BackgroundProxy, ProxyConfig, free_port

    double = ScriptedVLLM(tokenizer, "polar-tiny", max_model_len=131072)  # Hermes Agent refuses windows under 64K
    server = BackgroundServer(double.app)
    upstream = server.start()
    stack.callback(server.stop)
    proxy = BackgroundProxy(ProxyConfig(upstream=upstream, db=str(work / "captures.db"), port=free_port(),
                                        tokenizer=str(tokenizer), extra={"polar_upstream_timeout": 60}))
    proxy.start()
    stack.callback(proxy.stop)
    return double, proxy


def record(harness: Harness, runtime: Any, ca_cert: Path, image: str, double: Any, db: Path, work: Path,
           base_url: str | None = None) -> dict:
    from polar.capture.reader import CaptureReader
    from polar.doubles.script import Script

    session = session_name(harness)
    marker = MARKER.format(cli=harness.name)
    double.script = Script([{"match": marker, "steps": bugfix.steps(harness)}])
    # The task's marker names the session: it must be the recorded, stable one.
    run = bugfix.run_task(runtime, ca_cert, image, harness, session, work, marker=marker, base_url=base_url)
    rows = list(CaptureReader(db).calls(session=session, with_tokens=False))
    if not harness.success(run.exit_code) or "a + b" not in run.calc:
        raise RuntimeError(f"{harness.name} did not fix the bug (exit {run.exit_code}):\n{run.output[-2000:]}")
    hostnames = [line.split("=", 1)[1] for line in run.env.splitlines() if line.startswith("HOSTNAME=")]
    polar_host = base_url.split("//", 1)[1] if base_url else ""
    return fixture(harness, rows, Scrubber(harness, session, hostnames, marker, polar_host), marker)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    names = [h.name for h in (*CLIS, *AGENTS)]
    ap.add_argument("--cli", nargs="+", choices=names, default=names)
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--tokenizer", type=Path, default=DEFAULT_TOKENIZER)
    args = ap.parse_args(argv)
    from polar.mitm.transparent import add_listeners, ca_cert_path, remove_listeners, transparent_modes
    from polar.rollout.swe_image import swe_image
    from polar.sandboxes.docker_runtime import DockerRuntime, connect
    from polar.sandboxes.images import node_image

    args.out.mkdir(parents=True, exist_ok=True)
    client = connect()
    node = node_image(client)
    with tempfile.TemporaryDirectory(prefix="polar-record-") as tmp, ExitStack() as stack:
        work = Path(tmp)
        double, proxy = start_polar(stack, work, args.tokenizer)
        runtime = DockerRuntime(client=client, addresses=proxy.addon.gateway.registry)
        stack.callback(runtime.close)
        modes = transparent_modes(runtime.gateway_ip)
        add_listeners(modes)
        stack.callback(remove_listeners, modes)
        ca_cert = ca_cert_path(proxy.config.confdir)
        for harness in (h for h in (*CLIS, *AGENTS) if h.name in args.cli):
            agent = harness in AGENTS
            image = harness.install_layer(client, swe_image(client, node) if agent else node)
            data = record(harness, runtime, ca_cert, image, double, work / "captures.db", work,
                          f"http://{runtime.gateway_ip}" if agent else None)
            path = args.out / f"{harness.name}.json"
            path.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n")
            print(f"{path}: {path.stat().st_size:,} bytes — {data['api']}, "
                  f"{'streamed' if data['stream'] else 'not streamed'}, first body {data['first']['body_bytes']:,} B, "
                  f"later body {data['later']['body_bytes']:,} B, {data['calls_in_session']} calls")


if __name__ == "__main__":
    main()
