"""polar's side of transparent HTTPS capture: listening where a sandbox believes the provider is.

A sandbox (see `polar.sandboxes`) resolves every provider host to one address it can reach — the
gateway IP of its network — and trusts polar's CA. polar then listens on that address, ports 443
and 80, and terminates TLS with a certificate minted for whatever SNI the client sent. The
listeners are mitmproxy reverse-proxy modes whose target is never dialled: the polar addon
answers every request itself, `connection_strategy=lazy` keeps mitmproxy from connecting ahead of
time and `upstream_cert=false` keeps it from fetching the real certificate. `keep_host_header`
leaves the client's Host intact, so mitmweb shows the host the harness called.

Listeners come either with the proxy's start-up configuration (`with_transparent`) or are added to
a running in-process proxy once the runtime's network exists (`add_listeners`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import socket
import time
from pathlib import Path

from polar.mitm.proxy import ProxyConfig

# Hosts whose model APIs polar answers (the shared reference's wire/clis.md): the harnesses' default endpoints.
PROVIDER_HOSTS: tuple[str, ...] = (
    "api.anthropic.com",
    "api.openai.com",
    "chatgpt.com",
    "generativelanguage.googleapis.com",
    "cloudcode-pa.googleapis.com",
    "dashscope.aliyuncs.com",
    "dashscope-intl.aliyuncs.com",
    "dashscope-us.aliyuncs.com",
    "cn-hongkong.dashscope.aliyuncs.com",
    "coding.dashscope.aliyuncs.com",
    "portal.qwen.ai",
)

# mitmproxy requires a reverse target; it only names the connection, nothing ever dials it.
_NEVER_DIALLED = "polar.invalid"
CA_CERT_FILE = "mitmproxy-ca-cert.pem"  # the public certificate; the key lives in mitmproxy-ca.pem
_CA_BASENAME = "mitmproxy"


def transparent_modes(listen_ip: str, https_port: int = 443, http_port: int | None = 80) -> list[str]:
    """mitmproxy mode specs that listen on `listen_ip` for TLS (and plain HTTP) from sandboxes."""
    modes = [f"reverse:https://{_NEVER_DIALLED}@{listen_ip}:{https_port}"]
    if http_port is not None:
        modes.append(f"reverse:http://{_NEVER_DIALLED}@{listen_ip}:{http_port}")
    return modes


def with_transparent(
    config: ProxyConfig, listen_ip: str, https_port: int = 443, http_port: int | None = 80
) -> ProxyConfig:
    """`config` plus transparent listeners on `listen_ip`; its own listener stays (start-up waits on it)."""
    own = config.mitm_options()["mode"]
    extra = {
        **config.extra,
        "mode": [*own, *transparent_modes(listen_ip, https_port, http_port)],
        "keep_host_header": True,
    }
    return dataclasses.replace(config, extra=extra)


def add_listeners(specs: list[str], timeout: float = 10) -> None:
    """Open more listeners on the proxy running in this process, and wait until they accept.

    A runtime's network (and so the address polar must listen on) may only exist after polar has
    started; mitmproxy reconfigures its servers when its `mode` option changes, so listeners are
    added to the live proxy instead of restarting it. Call from any thread but the proxy's.
    """
    master = _running_master()
    new = [spec for spec in specs if spec not in master.options.mode]
    _on_proxy_loop(master, mode=[*master.options.mode, *new], keep_host_header=True).result(timeout)
    deadline = time.monotonic() + timeout
    for spec in new:
        address = _listen_address(master, spec)
        while True:
            try:
                socket.create_connection(address, timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"polar did not start listening for {spec} (see the proxy's log)") from None
                time.sleep(0.05)


def remove_listeners(specs: list[str], timeout: float = 10) -> None:
    """Close listeners opened by `add_listeners` (e.g. once their network is gone)."""
    master = _running_master()
    _on_proxy_loop(master, mode=[m for m in master.options.mode if m not in specs]).result(timeout)


def _running_master():
    from mitmproxy import ctx

    master = getattr(ctx, "master", None)
    if master is None or master.event_loop.is_closed() or master.should_exit.is_set():
        raise RuntimeError("no polar proxy runs in this process (start a BackgroundProxy first)")
    return master


def _on_proxy_loop(master, **options):
    async def update() -> None:
        master.options.update(**options)

    return asyncio.run_coroutine_threadsafe(update(), master.event_loop)


def _listen_address(master, spec: str) -> tuple[str, int]:
    from mitmproxy.proxy.mode_specs import ProxyMode

    mode = ProxyMode.parse(spec)
    host = mode.listen_host(master.options.listen_host) or "127.0.0.1"
    port = mode.listen_port(master.options.listen_port)
    assert port is not None, f"{spec} names no port"
    return host, port


def default_confdir() -> Path:
    return Path("~/.mitmproxy").expanduser()


def ca_cert_path(confdir: str | Path | None = None) -> Path:
    """Where mitmproxy keeps its CA *certificate* (written on first start, or by `ensure_ca`)."""
    base = Path(confdir).expanduser() if confdir else default_confdir()
    return base / CA_CERT_FILE


def ensure_ca(confdir: str | Path | None = None) -> Path:
    """Create mitmproxy's CA in `confdir` if it has none yet; return the certificate's path.

    Lets a runtime install the CA into sandboxes before the proxy has ever started. The key
    stays in the confdir (`mitmproxy-ca.pem`, mode 0600); only the certificate is handed out.
    """
    from mitmproxy.certs import CertStore
    from mitmproxy.options import KEY_SIZE

    path = ca_cert_path(confdir)
    if not path.exists():
        CertStore.create_store(path.parent, _CA_BASENAME, KEY_SIZE)
    return path
