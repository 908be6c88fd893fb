"""Running mitmproxy with polar's addons, from the CLI or in-process (tests, the demo).

Two modes now: `reverse` (the client's base URL points at polar: it answers every path itself)
and `regular` (an explicit HTTP(S) proxy; HTTPS clients must trust mitmproxy's CA). Transparent
container capture builds on these in `runtimes/`.
"""

from __future__ import annotations

import asyncio
import ctypes
import signal
import threading
import time
from dataclasses import dataclass, field, make_dataclass
from functools import partial
from typing import Any, Literal

from polar.config.options import OPTIONS, SPEC
from polar.mitm import shutdown
from polar.mitm.addon import GatewayAddon
from polar.mitm.chain import polar_addons
from polar.mitm.master import LeanMaster

_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """A Popen preexec_fn (Linux): the child gets SIGTERM when its parent dies, killed outright included, so a
    supervisor's workers and front, or a benchmark's servers, never outlive it."""
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


@dataclass
class _Listening:
    """How the proxy listens; the gateway's options (polar/config/options.py) join these as `ProxyConfig`'s fields."""

    mode: Literal["reverse", "regular"] = "reverse"
    host: str = "127.0.0.1"
    port: int = 8080
    web: bool = False
    web_port: int = 8081
    confdir: str | None = None  # mitmproxy's CA directory (default ~/.mitmproxy)
    extra: dict[str, Any] = field(default_factory=dict)  # further mitmproxy / polar options, by mitmproxy name

    def mitm_options(self) -> dict[str, Any]:
        # mitmproxy's reverse mode names one server (polar answers every call itself): a fleet's first will do.
        first = (self.upstream.replace(",", " ").split() or [self.upstream])[0]
        spec = f"reverse:{first}@{self.port}" if self.mode == "reverse" else f"regular@{self.port}"
        opts: dict[str, Any] = {
            "mode": [spec],
            "listen_host": self.host,
            # polar answers every call itself: never dial the upstream on the client's behalf.
            "connection_strategy": "lazy",
            "upstream_cert": False,
            "termlog_verbosity": "warn",
        }
        if self.confdir:
            opts["confdir"] = self.confdir
        if self.web:
            opts.update(web_port=self.web_port, web_host=self.host, web_open_browser=False)
        return opts

    def polar_options(self) -> dict[str, Any]:
        """Every polar option by its mitmproxy name, as the proxy will run with it (`extra` overrides them, as
        `--set` does `polar proxy`'s flags)."""
        return {o.name: self.option(o.name) for o in OPTIONS}

    def option(self, name: str) -> Any:
        """One polar option's value as the proxy will run with it (a text value in `extra`: parsed as its type)."""
        value = self.extra.get(name, getattr(self, SPEC[name].field))
        return SPEC[name].parse(value) if isinstance(value, str) and name in self.extra else value

    def mitm_extra(self) -> dict[str, Any]:
        """The `extra` options that are mitmproxy's own (polar's are in `polar_options`)."""
        return {key: value for key, value in self.extra.items() if key not in SPEC}


ProxyConfig = make_dataclass(
    "ProxyConfig",
    [(o.field, list[str] if o.many else o.type,
      field(default_factory=partial(list, o.default)) if o.many else field(default=o.default)) for o in OPTIONS],
    bases=(_Listening,),
)
ProxyConfig.__doc__ = """A polar proxy's set-up: how it listens, and each polar option (`tokenizer` set → token-faithful)."""


async def serve(config: ProxyConfig, ready: threading.Event | None = None, holder: dict | None = None) -> None:
    """Run until shut down. `holder` receives the master so another thread can stop it."""
    from mitmproxy import exceptions, options

    opts = options.Options()
    if config.web:
        from mitmproxy.tools.web.master import WebMaster

        master = WebMaster(opts, with_termlog=True)
    else:
        master = LeanMaster(opts)
    addons = polar_addons()
    master.addons.add(*addons)
    addon = addons[0]  # the gateway's
    # One update with every polar option, `--set` ones included: a first one without them would build a gateway on
    # the default database, or a token-faithful one without the template a later `--set` names.
    try:
        polar_options = config.polar_options()
    except ValueError as exc:
        raise exceptions.OptionsError(str(exc)) from None
    opts.update(**config.mitm_options(), **polar_options)
    for key, value in config.mitm_extra().items():  # text values (from the CLI) are parsed by mitmproxy
        opts.set(f"{key}={value}") if isinstance(value, str) else opts.update(**{key: value})
    if holder is not None:
        holder["master"], holder["addon"] = master, addon
    if ready is not None:
        asyncio.get_running_loop().call_later(0.3, ready.set)
    await master.run()  # the addon drains on SIGTERM / SIGINT (mitm/shutdown.py)


class BackgroundProxy:
    """The proxy on its own thread and event loop, for tests and the in-process demo.

    One per process: mitmproxy keeps its master in a module-global context, so a second master
    in the same process would receive the first one's flows. Run more proxies as processes
    (`SubprocessProxy`).
    """

    _running: "BackgroundProxy | None" = None

    def __init__(self, config: ProxyConfig):
        self.config = config
        self._holder: dict = {}
        self._ready = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(serve(config, self._ready, self._holder)), daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.config.host}:{self.config.port}"

    @property
    def addon(self) -> GatewayAddon:
        return self._holder["addon"]

    @property
    def master(self):
        """The running mitmproxy master (to add listeners, e.g. for a container network)."""
        return self._holder["master"]

    # -- weight updates, from any thread: the gateway lives on the proxy's own event loop --------

    def pause_sampling(self) -> None:
        self._on_loop(self.addon.gate.pause)

    def resume_sampling(self, policy_version: int | None = None) -> None:
        self._on_loop(self.addon.gate.resume, policy_version)

    def drain(self, timeout: float = 60.0) -> bool:
        """Wait until no model call is being sampled; False when `timeout` passed first."""
        future = asyncio.run_coroutine_threadsafe(
            asyncio.wait_for(self.addon.gate.drain(), timeout), self.master.event_loop)
        try:
            future.result(timeout + 1)
            return True
        except (TimeoutError, asyncio.TimeoutError):
            return False

    def _on_loop(self, fn, *args) -> None:
        async def call():
            fn(*args)

        asyncio.run_coroutine_threadsafe(call(), self.master.event_loop).result(10)

    def start(self, timeout: float = 120) -> str:
        import socket

        if BackgroundProxy._running is not None:
            raise RuntimeError("a polar proxy already runs in this process; start another as a SubprocessProxy")
        BackgroundProxy._running = self
        self._thread.start()
        deadline = time.time() + timeout
        while time.time() < deadline:
            if not self._thread.is_alive():
                raise RuntimeError("polar proxy exited during start-up")
            if self._ready.is_set():
                try:
                    socket.create_connection((self.config.host, self.config.port), timeout=1).close()
                    return self.url
                except OSError:
                    pass
            time.sleep(0.05)
        raise RuntimeError(f"polar proxy did not start listening on {self.url}")

    def stop(self) -> None:
        master = self._holder.get("master")
        if master is not None:
            master.shutdown()
        self._thread.join(timeout=30)
        if BackgroundProxy._running is self:
            BackgroundProxy._running = None


class SubprocessProxy:
    """`polar proxy` as a child process (for a second proxy beside an in-process one, or benchmarks)."""

    def __init__(self, config: ProxyConfig):
        self.config = config
        self.proc = None

    @property
    def url(self) -> str:
        return f"http://{self.config.host}:{self.config.port}"

    def start(self, timeout: float = 120) -> str:
        self.launch()
        return self.wait_ready(timeout)

    def command(self) -> list[str]:
        import sys

        c = self.config
        cmd = [sys.executable, "-m", "polar.cli", "proxy", "--mode", c.mode, "--host", c.host, "--port", str(c.port)]
        for o in OPTIONS:  # the flags `polar proxy` derives from the same spec
            value = getattr(c, o.field)
            if value != o.default:
                cmd += [a for item in (value if o.many else [value]) for a in (o.flag, str(item))]
        if c.web:
            cmd += ["--web", "--web-port", str(c.web_port)]
        for key, value in c.extra.items():
            cmd += ["--set", f"{key}={value}"]
        return cmd

    def launch(self, **popen) -> None:
        """Start the process without waiting (several start side by side, then `wait_ready` each). `popen`:
        Popen's own arguments (stdout, where its log goes, is dropped unless given)."""
        import subprocess

        self.proc = subprocess.Popen(self.command(), **{"stdout": subprocess.DEVNULL, **popen})

    def wait_ready(self, timeout: float = 120) -> str:
        import socket

        c = self.config
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"polar proxy exited with {self.proc.returncode} during start-up")
            try:
                socket.create_connection((c.host, c.port), timeout=1).close()
                return self.url
            except OSError:
                time.sleep(0.1)
        raise RuntimeError(f"polar proxy did not start listening on {self.url}")

    def stop(self) -> None:
        """SIGTERM: polar drains its calls in flight (mitm/shutdown.py); killed if it outlasts the drain."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            shutdown.wait_or_signal(self.proc, shutdown.stop_wait_s(self.config))


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
