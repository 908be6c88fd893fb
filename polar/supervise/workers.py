"""`polar proxy --workers N`: N gateway processes behind one address, every session on one of them.

Each worker is a whole `polar proxy` on a loopback port with its own capture shard (capture/shards.py):
session state, the session registry and the capture writer are per process, so a session must stay
on one worker. The front is haproxy (front.py), hashing the session key polar itself resolves.

A worker or the front that exits is fatal, on purpose: its sessions' calls would fail or, if the
front re-balanced them, continue on a worker without their state. The supervisor says which one
died and how, stops the rest and exits non-zero; restarting is the job of whatever runs polar
(systemd, Ray, a shell loop), and a restarted worker rebuilds its sessions' state from its shard.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

from polar.capture.shards import shard_path
from polar.mitm.proxy import ProxyConfig, SubprocessProxy, die_with_parent, free_port
from polar.mitm.shutdown import STOP_MARGIN_S, stop_wait_s, wait_or_signal
from polar.supervise.front import CLIENT_ADDR_HEADER, haproxy_binary, haproxy_config

# Children in a session of their own: a Ctrl-C reaches the supervisor alone, which then stops them in
# order (front first), instead of racing them to their deaths and reporting one as a failure.
_CHILD = {"preexec_fn": die_with_parent, "start_new_session": True}
_FRONT_FLUSH_S = 2.0


@dataclass
class Child:
    name: str  # "worker 1", "front (haproxy)"
    proc: subprocess.Popen
    detail: str  # where it listens, what it writes

    def exit_reason(self) -> str | None:
        code = self.proc.poll()
        if code is None:
            return None
        if code < 0:
            return f"was killed by {signal.Signals(-code).name}"
        return f"exited with code {code}"


class WorkerSet:
    """The workers and their front, started together and stopped together."""

    def __init__(self, config: ProxyConfig, count: int, out=sys.stderr):
        if config.mode != "reverse" or config.web:
            raise ValueError("--workers needs reverse (base-URL) mode without --web: the front routes by what "
                             "a plain HTTP request names (an explicit proxy's HTTPS tunnels hide it)")
        self.config, self.count, self.out = config, count, out
        self.children: list[Child] = []
        self._dir = tempfile.TemporaryDirectory(prefix="polar-front-")
        self.workers = [
            SubprocessProxy(replace(config, host="127.0.0.1", port=free_port(), db=str(shard_path(config.db, i)),
                                    client_addr_header=CLIENT_ADDR_HEADER,  # the front's, whatever --set said
                                    extra={k: v for k, v in config.extra.items() if k != "polar_client_addr_header"}))
            for i in range(count)
        ]

    def start(self, timeout: float = 120) -> None:
        haproxy = haproxy_binary()
        if haproxy is None:
            raise RuntimeError("--workers needs haproxy on PATH (Debian: apt-get install haproxy)")
        try:
            for i, worker in enumerate(self.workers):  # all start side by side; each loads its tokenizer
                worker.launch(**_CHILD)
                self.children.append(Child(f"worker {i}", worker.proc, f"{worker.url}, captures in {worker.config.db}"))
            for worker in self.workers:
                worker.wait_ready(timeout)
            cfg = Path(self._dir.name) / "haproxy.cfg"
            cfg.write_text(haproxy_config(self.config.host, self.config.port, [w.config.port for w in self.workers]))
            check = subprocess.run([haproxy, "-c", "-q", "-f", str(cfg)], capture_output=True, text=True)
            if check.returncode:
                raise RuntimeError(f"haproxy refused the generated config {cfg}:\n{check.stdout}{check.stderr}")
            front = subprocess.Popen([haproxy, "-db", "-f", str(cfg)], **_CHILD)
            self.children.append(Child("front (haproxy)", front, f"http://{self.config.host}:{self.config.port}"))
            self._wait_listening(timeout)
        except BaseException:
            self.stop()
            raise

    def _wait_listening(self, timeout: float) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            self._check_alive()
            try:
                socket.create_connection((self.config.host, self.config.port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"the front did not listen on {self.config.host}:{self.config.port}")

    def describe(self) -> list[str]:
        return [f"  {c.name}: pid {c.proc.pid}, {c.detail}" for c in self.children]

    def _check_alive(self) -> None:
        for child in self.children:
            reason = child.exit_reason()
            if reason is not None:
                raise ChildDied(f"polar: {child.name} (pid {child.proc.pid}, {child.detail}) {reason}")

    def run(self) -> int:
        """Supervise until a signal (exit 0) or a child's death (exit 1, said on stderr)."""
        stopping: list[int] = []

        def on_signal(signum, _frame) -> None:
            stopping.append(signum)

        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, on_signal)
        try:
            while not stopping:
                self._check_alive()
                time.sleep(0.2)
            return 0
        except ChildDied as died:
            print(f"\n{died}; stopping the other workers and the front. Its sessions' calls fail until polar "
                  "is restarted (each worker rebuilds its sessions' state from its shard).", file=self.out, flush=True)
            return 1
        finally:
            self.stop()

    def stop(self) -> None:
        """The front first takes no new connections (haproxy's soft stop), every worker drains its calls in flight
        (`polar_drain` seconds) and exits; then the front, whose connections are all idle by then, stops too
        (soft stop alone waits on a client's idle keep-alive connection). Past the drain and a margin, kill."""
        front, workers = self.children[len(self.workers):], self.children[: len(self.workers)]
        _signal(front, signal.SIGUSR1)
        _signal(workers, signal.SIGTERM)
        _wait(workers, stop_wait_s(self.config))
        _wait(front, _FRONT_FLUSH_S, then=signal.SIGTERM)  # answers haproxy still writes to slow clients
        _wait(front, STOP_MARGIN_S)
        self._dir.cleanup()


def _signal(children: list[Child], signum: int) -> None:
    for child in children:
        if child.proc.poll() is None:
            child.proc.send_signal(signum)


def _wait(children: list[Child], seconds: float, then: int = signal.SIGKILL) -> None:
    """Wait for the children to exit, `seconds` in all; then send `then` to those still running."""
    deadline = time.monotonic() + seconds
    for child in children:
        wait_or_signal(child.proc, deadline - time.monotonic(), then)


class ChildDied(RuntimeError):
    """A worker or the front exited while polar was serving."""
