"""What a benchmark starts and measures: servers as child processes (dying with the benchmark), their CPU from
/proc, and the targets the load goes to, each with the request it gets."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
from polar.mitm.proxy import die_with_parent, free_port  # noqa: E402

CACHE = Path(os.environ.get("POLAR_CACHE", Path.home() / ".cache" / "polar"))
DEFAULT_TOKENIZER = CACHE / "models" / "qwen35-tiny"
DEFAULT_LITELLM = CACHE / "litellm-venv" / "bin" / "litellm"
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}  # never a hub at run time
MESSAGES = [{"role": "user", "content": "Say hello in one short sentence."}]
ANTHROPIC_BODY = {"model": "claude-sonnet-4-5", "max_tokens": 64, "messages": MESSAGES}
ANTHROPIC_HEADERS = {"x-api-key": "bench", "anthropic-version": "2023-06-01", "content-type": "application/json"}
# What polar sends upstream for ANTHROPIC_BODY in chat-template mode: the fair "direct" call.
DIRECT_BODY = {"model": "polar-tiny", "messages": MESSAGES, "max_tokens": 64, "return_token_ids": True,
               "logprobs": True}
CLK_TCK = os.sysconf("SC_CLK_TCK")


# -- processes ------------------------------------------------------------------------------------


def children(pid: int) -> list[int]:
    """The process's direct children (those of every thread)."""
    out: list[int] = []
    for listing in Path(f"/proc/{pid}/task").glob("*/children"):
        try:
            out += [int(k) for k in listing.read_text().split()]
        except OSError:  # the thread or process is gone
            continue
    return out


def descendants(pid: int) -> list[int]:
    out: list[int] = []
    for kid in children(pid):
        out += [kid, *descendants(kid)]
    return out


def _stat_ticks(stat_file: str) -> int:
    """utime + stime from a /proc stat file (0 when the process or thread is gone)."""
    try:
        stat = Path(stat_file).read_text()
    except OSError:
        return 0
    fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) ": state is field 0
    return int(fields[11]) + int(fields[12])


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process and its live descendants (from /proc, in seconds)."""
    return sum(_stat_ticks(f"/proc/{p}/stat") for p in [pid, *descendants(pid)]) / CLK_TCK


def main_thread_cpu_seconds(pid: int) -> float:
    """CPU time of the process's main thread alone: for polar and mitmdump, the event loop (mitmproxy's
    layers and hooks, and the addon); the rest of the process is its other threads (polar's capture writer)."""
    return _stat_ticks(f"/proc/{pid}/task/{pid}/stat") / CLK_TCK


def comm(pid: int) -> str:
    """The process's command name ('' when it is gone)."""
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


class Service:
    """A server started as a child process: output in a log file, up when its health URL answers."""

    def __init__(self, name: str, cmd: Sequence[str], health_url: str, log: Path,
                 env: dict[str, str] | None = None, cwd: Path | None = None):
        self.name, self.cmd, self.health_url, self.log = name, list(cmd), health_url, log
        self.env, self.cwd = env, cwd
        self.proc: subprocess.Popen | None = None
        self.db: Path | None = None  # polar's capture database (start_polar)

    def start(self, timeout: float = 120) -> Service:
        with open(self.log, "wb") as out:
            # A benchmark killed outright (kill -9, a CI timeout) takes its servers with it.
            self.proc = subprocess.Popen(self.cmd, stdout=out, stderr=subprocess.STDOUT, cwd=self.cwd,
                                         env={**os.environ, **(self.env or {})}, preexec_fn=die_with_parent)
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode} while starting:\n{self.tail()}")
            try:
                if httpx.get(self.health_url, timeout=2).status_code < 500:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"{self.name} did not answer {self.health_url} within {timeout:.0f} s:\n{self.tail()}")

    def tail(self, lines: int = 30) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def cpu_seconds(self) -> float:
        return cpu_seconds(self.proc.pid) if self.proc else 0.0

    def main_thread_cpu_seconds(self) -> float:
        return main_thread_cpu_seconds(self.proc.pid) if self.proc else 0.0

    @property
    def base_url(self) -> str:
        """Where it serves: its health URL's scheme, host and port."""
        scheme, _, rest = self.health_url.partition("://")
        return f"{scheme}://{rest.partition('/')[0]}"

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=30)


# -- the upstream, polar, LiteLLM -------------------------------------------------------------------


def start_upstream(workdir: Path, tokenizer: str | Path, extra: Sequence[str] = ()) -> Service:
    """scripts/bench_upstream.py (`extra`: more of its options, e.g. its streams' pace)."""
    port = free_port()
    cmd = [sys.executable, str(REPO / "scripts" / "bench_upstream.py"), "--port", str(port),
           "--tokenizer", str(tokenizer), *extra]
    return Service("upstream", cmd, f"http://127.0.0.1:{port}/health", workdir / "upstream.log", env=OFFLINE).start()


def upstream_url(upstream: Service) -> str:
    return upstream.health_url.removesuffix("/health")


def upstream_last_body(upstream: Service, path: str) -> dict[str, Any]:
    """The last request body the upstream double got on `path`: what a proxy sent it."""
    return httpx.get(f"{upstream_url(upstream)}/_bench/stats", timeout=10).json()["last"][path]


def start_polar(workdir: Path, upstream: Service, sync: str, tokenizer: str | Path | None = None, *,
                name: str | None = None, tag: str | None = None, tree: Path = REPO,
                extra: Sequence[str] = ()) -> Service:
    """`polar proxy` in chat-template mode (token-faithful with a tokenizer), captures in its own database
    with this commit mode; `tree`: the checkout whose polar runs (`-m polar.cli` from there imports that
    tree's polar, whatever the venv has installed); `extra`: more of its flags (e.g. --workers N)."""
    port = free_port()
    tag = tag or sync.lower() + ("-tokens" if tokenizer else "")
    db = workdir / f"captures-{tag}.db"
    cmd = [sys.executable, "-m", "polar.cli", "proxy", *extra, "--upstream", upstream_url(upstream), "--port", str(port),
           "--db", str(db), "--set", f"polar_db_sync={sync}"]
    if tokenizer:
        cmd += ["--tokenizer", str(tokenizer)]
    name = name or f"polar (sync={sync}{', token-faithful' if tokenizer else ''})"
    service = Service(name, cmd, f"http://127.0.0.1:{port}/", workdir / f"polar-{tag}.log", env=OFFLINE, cwd=tree)
    service.db = db
    return service.start()


def start_workers(workdir: Path, upstream: Service, sync: str, count: int) -> Service:
    """`polar proxy --workers N`: haproxy in front of N gateway processes, each capturing in a shard of its own
    (polar.capture.shards) of `captures-workers.db`."""
    return start_polar(workdir, upstream, sync, name=f"polar --workers {count}", tag="workers",
                       extra=["--workers", str(count)])


def front_pid(service: Service) -> int | None:
    """The haproxy process among a `--workers` supervisor's children."""
    return next((pid for pid in descendants(service.proc.pid) if comm(pid) == "haproxy"), None)


def worker_pids(service: Service) -> list[int]:
    """A `--workers` supervisor's children that are gateway workers (all but haproxy)."""
    return [pid for pid in children(service.proc.pid) if comm(pid) != "haproxy"]


def peak_rss(pid: int) -> int:
    """VmHWM of a process and its live children, in bytes."""
    total = 0
    for p in [pid, *descendants(pid)]:
        try:
            status = Path(f"/proc/{p}/status").read_text()
        except OSError:
            continue
        total += next((int(line.split()[1]) * 1024 for line in status.splitlines() if line.startswith("VmHWM:")), 0)
    return total


def litellm_config(upstream_url: str, token_ids: bool = True, extra_body: dict | None = None,
                   names: Sequence[str] = (ANTHROPIC_BODY["model"],), extra_params: dict | None = None) -> dict:
    """The LiteLLM proxy's model list: each model name (default: the Anthropic one) served by the upstream's
    chat endpoint (`extra_body`: more fields for every upstream request; `extra_params`: more litellm_params)."""
    params = {**(extra_params or {}), "model": f"hosted_vllm/{DIRECT_BODY['model']}", "api_base": f"{upstream_url}/v1",
              "api_key": "bench"}
    if token_ids:  # what polar asks vLLM for as well: the upstream does the same work and sends the same bytes
        params["extra_body"] = {"return_token_ids": True, "logprobs": True}
    if extra_body:
        params["extra_body"] = {**params.get("extra_body", {}), **extra_body}
    return {"model_list": [{"model_name": name, "litellm_params": params} for name in names]}


def start_litellm(workdir: Path, upstream: Service, executable: Path, token_ids: bool = True,
                  extra_body: dict | None = None, names: Sequence[str] = (ANTHROPIC_BODY["model"],),
                  extra_params: dict | None = None) -> Service:
    """The LiteLLM proxy (scripts/setup_litellm.sh, its own venv), one worker, the upstream as a `hosted_vllm`
    model asked for the same token ids and logprobs polar asks for (`token_ids=False`: LiteLLM's default)."""
    name = "litellm" if token_ids else "litellm-plain"
    config = workdir / f"{name}.yaml"
    settings = litellm_config(upstream_url(upstream), token_ids, extra_body, names, extra_params)
    config.write_text(json.dumps(settings, indent=2))  # JSON is YAML
    port = free_port()
    cmd = [str(executable), "--config", str(config), "--host", "127.0.0.1", "--port", str(port), "--num_workers", "1",
           "--telemetry", "False"]
    # The bundled cost map instead of fetching one at start-up (no network here); errors only in its log.
    env = {"LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_LOG": "ERROR"}
    return Service(name, cmd, f"http://127.0.0.1:{port}/health/liveliness", workdir / f"{name}.log",
                   env=env, cwd=workdir).start(timeout=180)


# -- targets --------------------------------------------------------------------------------------


@dataclass
class Target:
    """Where the load goes: an endpoint, the request it gets, and the proxy process (None: direct)."""

    name: str
    url: str
    body: dict[str, Any]
    headers: dict[str, str]
    proxy: Service | None = None
    session_per_client: bool = False  # client i's calls name session bench-i (`/s/bench-i/` base URL)
    front: int | None = None  # a process of the proxy's whose CPU is also read apart (`--workers`: haproxy)

    def request(self, stream: bool) -> dict[str, Any]:
        return {**self.body, "stream": True} if stream else self.body

    def url_for(self, client: int) -> str:
        if not self.session_per_client:
            return self.url
        scheme, _, rest = self.url.partition("://")
        host, _, path = rest.partition("/")
        return f"{scheme}://{host}/s/bench-{client}/{path}"


def direct_target(upstream: Service) -> Target:
    return Target("direct", f"{upstream_url(upstream)}/v1/chat/completions", DIRECT_BODY,
                  {"content-type": "application/json"})


def anthropic_target(name: str, proxy: Service, session_per_client: bool = False) -> Target:
    """The small Anthropic Messages call through a proxy (polar in any form, LiteLLM)."""
    return Target(name, f"{proxy.base_url}/v1/messages", ANTHROPIC_BODY, ANTHROPIC_HEADERS, proxy, session_per_client)


def workers_target(name: str, workers: Service) -> Target:
    """The small Anthropic call through `polar proxy --workers N` (start_workers), every client a session of its
    own so the front spreads them over the workers as it would agents; haproxy's CPU read apart."""
    return Target(name, f"{workers.base_url}/v1/messages", ANTHROPIC_BODY, ANTHROPIC_HEADERS, workers,
                  session_per_client=True, front=front_pid(workers))


def polar_target(workdir: Path, upstream: Service, sync: str, name: str = "polar") -> Target:
    return anthropic_target(name, start_polar(workdir, upstream, sync))


def litellm_target(workdir: Path, upstream: Service, executable: Path, token_ids: bool = True) -> Target:
    proxy = start_litellm(workdir, upstream, executable, token_ids)
    return anthropic_target(proxy.name, proxy)


def mitmdump_target(workdir: Path, upstream: Service) -> Target:
    """mitmproxy alone: `mitmdump` as a plain reverse proxy to the upstream, no addon script, direct's
    request through it (its default addons and its server side included)."""
    port = free_port()
    cmd = [str(Path(sys.executable).with_name("mitmdump")), "--mode", f"reverse:{upstream_url(upstream)}",
           "--listen-host", "127.0.0.1", "--listen-port", str(port), "--quiet"]
    proxy = Service("mitmdump", cmd, f"http://127.0.0.1:{port}/health", workdir / "mitmdump.log").start()
    return Target("mitmdump", f"{proxy.base_url}/v1/chat/completions", DIRECT_BODY,
                  {"content-type": "application/json"}, proxy)


FLOOR_TARGETS = {"answer": "mitm answers", "relay": "mitm relay"}


def floor_target(workdir: Path, upstream: Service, mode: str) -> Target:
    """mitmproxy as polar runs it (its lean master) with a one-job addon in polar's place
    (scripts/bench_floor_proxy.py): `answer` answers from memory, `relay` sends direct's request on to the
    upstream over polar's own upstream client (polar/upstream/h1.py) — what polar's path costs before polar's
    own work."""
    port = free_port()
    cmd = [sys.executable, str(REPO / "scripts" / "bench_floor_proxy.py"), "--port", str(port),
           "--upstream", upstream_url(upstream), "--mode", mode]
    name = FLOOR_TARGETS[mode]
    proxy = Service(name, cmd, f"http://127.0.0.1:{port}/health", workdir / f"floor-{mode}.log").start()
    return Target(name, f"{proxy.base_url}/v1/chat/completions", DIRECT_BODY,
                  {"content-type": "application/json"}, proxy)


def reference_targets(workdir: Path, upstream: Service, args: argparse.Namespace,
                      services: list[Service]) -> list[Target]:
    """The proxies measured beside polar as its floors (`--mitmdump`, `--floor`), each added to `services`
    as it starts (for the caller to stop)."""
    targets: list[Target] = []

    def started(target: Target) -> None:
        targets.append(target)
        services.append(target.proxy)

    if args.mitmdump:
        started(mitmdump_target(workdir, upstream))
    for mode in FLOOR_TARGETS if args.floor else ():
        started(floor_target(workdir, upstream, mode))
    return targets


def answer_text(target: Target) -> str:
    """One non-streamed call's answer text: proves the target is wired to the upstream before timing it."""
    resp = httpx.post(target.url, json=target.request(False), headers=target.headers, timeout=120)
    if resp.status_code != 200:
        raise RuntimeError(f"{target.name} answered HTTP {resp.status_code}: {resp.text[:500]}")
    body = resp.json()
    if "choices" in body:  # OpenAI chat
        return body["choices"][0]["message"]["content"]
    return "".join(part.get("text", "") for part in body.get("content", []))  # Anthropic Messages


def check_targets(targets: list[Target]) -> None:
    """Every target must give the answer direct gives (the same upstream answer, translated; polar leaves out the
    template's newlines after </think> that vLLM's answer keeps)."""
    want = answer_text(targets[0]).strip("\n")
    for target in targets[1:]:
        got = answer_text(target).strip("\n")
        if got != want:
            raise RuntimeError(f"{target.name} answered {got!r}, direct answered {want!r}")


def upstream_stats(upstream: Service) -> str:
    stats = httpx.get(f"{upstream_url(upstream)}/_bench/stats", timeout=10).json()
    return (f"upstream: {stats['calls']} calls, {stats['misses']} computed by the double "
            f"({len(stats['bodies'])} distinct request {'body' if len(stats['bodies']) == 1 else 'bodies'}), "
            "the rest served from its answer cache")
