"""Harness-side HTTPS reaches polar unchanged: real containers, the real proxy, the scripted double.

Inside the containers nothing names polar: no base URL, no proxy variable; the calls go to the
providers' own hosts over TLS and are answered with certificates from polar's CA.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from polar.sandboxes import SandboxSpec

pytestmark = pytest.mark.docker

OPENAI_CALL = (
    "curl -sS --fail-with-body https://api.openai.com/v1/chat/completions "
    "-H 'authorization: Bearer sk-container' -H 'content-type: application/json' "
    """-d '{"model": "gpt-4o", "messages": [{"role": "user", "content": "%s"}]}'"""
)
# Node's fetch: trusts polar through NODE_EXTRA_CA_CERTS, as the Node-based CLIs do.
ANTHROPIC_CALL = """node -e '
fetch("https://api.anthropic.com/v1/messages", {method: "POST",
  headers: {"x-api-key": "sk-ant-container", "anthropic-version": "2023-06-01", "content-type": "application/json"},
  body: JSON.stringify({model: "claude-sonnet-4-5", max_tokens: 64, messages: [{role: "user", content: "%s"}]})})
.then(async r => { console.log(r.status); console.log(await r.text()); })
.catch(e => { console.error(String(e.cause || e)); process.exit(3); })'"""
# Plain HTTP on port 80 reaches polar too.
GEMINI_CALL = (
    "curl -sS --fail-with-body 'http://generativelanguage.googleapis.com/v1beta/models/gemini-2.5-flash:generateContent' "
    "-H 'x-goog-api-key: g-container' -H 'content-type: application/json' "
    """-d '{"contents": [{"role": "user", "parts": [{"text": "%s"}]}]}'"""
)


def _spec(transparent, image: str, session: str) -> SandboxSpec:
    return SandboxSpec(image=image, session=session, ca_cert=transparent.ca_cert)


def test_provider_calls_reach_polar_without_base_url_or_proxy(transparent, node_image):
    with transparent.runtime.start(_spec(transparent, node_image, "solo")) as box:
        env = box.exec("env").stdout
        assert not [line for line in env.splitlines() if "PROXY" in line.upper() or "BASE_URL" in line.upper()]

        openai = box.exec(OPENAI_CALL % "hello from solo via curl", timeout=30)
        assert openai.ok, openai
        chat = json.loads(openai.stdout)
        assert chat["object"] == "chat.completion"
        assert chat["model"] == "gpt-4o"
        assert "hello from solo via curl" in chat["choices"][0]["message"]["content"]

        anthropic = box.exec(ANTHROPIC_CALL % "hello from solo via node", timeout=30)
        assert anthropic.ok, anthropic
        status, body = anthropic.stdout.split("\n", 1)
        message = json.loads(body)
        assert status == "200" and message["type"] == "message" and message["role"] == "assistant"
        assert "hello from solo via node" in message["content"][0]["text"]

        gemini = box.exec(GEMINI_CALL % "hello from solo over http", timeout=30)
        assert gemini.ok, gemini
        assert "hello from solo over http" in json.loads(gemini.stdout)["candidates"][0]["content"]["parts"][0]["text"]

        rows = transparent.rows("solo")
        assert [(r["provider"], r["status"], r["client"]) for r in rows] == [
            ("openai_chat", "ok", box.address),
            ("anthropic", "ok", box.address),
            ("gemini", "ok", box.address),
        ]


OTHER_HOSTS = [
    "https://example.com/",
    "https://statsig.anthropic.com/v1/initialize",  # telemetry and update hosts the CLIs phone
    "https://http-intake.logs.us5.datadoghq.com/api/v2/logs",
    "https://play.googleapis.com/log",
    "http://packages.example.org/",  # plain HTTP, as a CLI's self-updater might try
]


def test_other_hosts_fail_fast(transparent, node_image):
    """Each failure is timed inside the container (process start-up excluded: the machine may be busy)."""
    with transparent.runtime.start(_spec(transparent, node_image, "egress")) as box:
        for url in OTHER_HOSTS:
            started = time.monotonic()
            curl = box.exec(["curl", "-sS", "-m", "20", "-w", "%{time_total}", url])
            fetch = (
                f"const t = performance.now(); fetch({url!r}).then(() => process.exit(0), e => "
                "{ console.log(e.cause?.code, (performance.now() - t) / 1000); process.exit(4); })"
            )
            node = box.exec(["node", "-e", fetch])
            wall = time.monotonic() - started
            assert curl.exit_code == 6 and "Could not resolve host" in curl.stderr, curl  # DNS, not a timeout
            code, node_s = node.stdout.split()
            assert node.exit_code == 4 and code in ("EAI_AGAIN", "ENOTFOUND"), node
            assert float(curl.stdout) < 2 and float(node_s) < 2, (url, curl.stdout, node_s)
            assert wall < 15, (url, wall)  # nothing hangs, whatever the load


def test_host_services_other_than_polar_are_refused(transparent, node_image):
    """A service on the host's wildcard address is not reachable from the session network."""
    with socket.socket() as server:
        server.bind(("0.0.0.0", 0))
        server.listen()
        threading.Thread(target=lambda: server.accept(), daemon=True).start()
        port = server.getsockname()[1]
        with transparent.runtime.start(_spec(transparent, node_image, "host-ports")) as box:
            probe = box.exec(["curl", "-sS", "-m", "10", "-w", "%{time_total}", f"http://{transparent.runtime.gateway_ip}:{port}/"])
            polar = box.exec(["curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", "https://api.openai.com/"])
    assert probe.exit_code == 7 and float(probe.stdout) < 2, probe  # refused, not left to time out
    assert polar.ok and polar.stdout == "200", polar


def test_ca_key_never_enters_the_container(transparent, node_image):
    pem = (transparent.confdir / "mitmproxy-ca.pem").read_text()
    key_body = pem.split("-----BEGIN RSA PRIVATE KEY-----")[1].split("-----END")[0].split()
    cert_body = transparent.ca_cert.read_text().split()
    needle_key, needle_cert = key_body[len(key_body) // 2], cert_body[len(cert_body) // 2]
    search = "grep -rlsF -e {} / --exclude-dir=proc --exclude-dir=sys --exclude-dir=dev"
    with transparent.runtime.start(_spec(transparent, node_image, "key-search")) as box:
        key_hits = box.exec(search.format(needle_key), timeout=120)
        cert_hits = box.exec(search.format(needle_cert), timeout=120)
        private = box.exec("grep -rlsF 'PRIVATE KEY' /etc/ssl /usr/local/share/ca-certificates", timeout=60)
    assert key_hits.exit_code == 1 and key_hits.stdout == "", key_hits  # grep: 1 = no match anywhere
    # The same search does find the certificate: it would have found the key.
    assert "/usr/local/share/ca-certificates/polar-ca.crt" in cert_hits.stdout.split(), cert_hits
    assert private.stdout == "", private


def test_parallel_containers_are_separate_sessions(transparent, node_image):
    sessions = ["par-a", "par-b", "par-c"]

    def run(session: str) -> tuple[str, str | None, str]:
        with transparent.runtime.start(_spec(transparent, node_image, session)) as box:
            out = box.exec(OPENAI_CALL % f"I am {session}", timeout=30)
            assert out.ok, out
            return session, box.address, json.loads(out.stdout)["choices"][0]["message"]["content"]

    with ThreadPoolExecutor(len(sessions)) as pool:
        results = list(pool.map(run, sessions))

    assert len({address for _, address, _ in results}) == len(sessions)
    for session, address, answer in results:
        assert f"I am {session}" in answer
        rows = transparent.rows(session)
        assert len(rows) == 1 and rows[0]["client"] == address and rows[0]["status"] == "ok"
        assert f"I am {session}".encode() in rows[0]["request_body"]


def test_containers_cannot_reach_each_other(transparent, node_image):
    serve = "nohup node -e 'require(\"http\").createServer((q, s) => s.end(\"hi\")).listen(8000)' >/dev/null 2>&1 &"
    with (
        transparent.runtime.start(_spec(transparent, node_image, "icc-a")) as a,
        transparent.runtime.start(_spec(transparent, node_image, "icc-b")) as b,
    ):
        b.exec(serve)
        local = b.exec("for i in $(seq 50); do curl -s localhost:8000 && exit 0; sleep 0.1; done; exit 1")
        across = a.exec(["curl", "-sS", "-m", "2", f"http://{b.address}:8000/"])
    assert local.ok and local.stdout == "hi", local
    assert not across.ok and across.stdout == "", across


def test_exec_timeout_and_copies(transparent, node_image, tmp_path):
    src = tmp_path / "task"
    (src / "sub").mkdir(parents=True)
    (src / "sub" / "a.txt").write_text("alpha")
    with transparent.runtime.start(_spec(transparent, node_image, "files")) as box:
        slow = box.exec("sleep 30", timeout=1)
        box.copy_in(src, "/work/task")
        edited = box.exec("cat task/sub/a.txt && echo beta > task/sub/b.txt")
        box.copy_out("/work/task", tmp_path / "back")
        workdir = box.exec("pwd", env={"X": "1"}).stdout.strip()
    assert slow.timed_out and not slow.ok
    assert edited.ok and edited.stdout == "alpha"
    assert (tmp_path / "back" / "sub" / "a.txt").read_text() == "alpha"
    assert (tmp_path / "back" / "sub" / "b.txt").read_text() == "beta\n"
    assert workdir == "/work"


def test_orphans_of_a_dead_polar_process_are_reaped(docker_client, node_image):
    """A killed rollout server's containers and network go when the next runtime starts."""
    import subprocess

    from polar.sandboxes.docker_runtime import BRIDGE_OPTION, LABEL, OWNER, reap_orphans

    gone = subprocess.Popen(["true"])
    gone.wait()  # a pid that no longer runs
    owner = f"{__import__('socket').gethostname()}:{gone.pid}"
    bridge = "polar-orphan0"  # with the host-port rules a restrict_host runtime puts on its bridge
    docker_client.networks.create("polar-orphan-test", internal=True, labels={OWNER: owner},
                                  options={BRIDGE_OPTION: bridge})
    rules = [["-i", bridge, "-j", "REJECT"], ["-i", bridge, "-p", "tcp", "-m", "multiport", "--dports", "80,443",
                                                 "-j", "ACCEPT"]]
    gone_bridge = "polar0dead0"  # a rule left on a bridge whose network is already gone
    for rule in [*rules, ["-i", gone_bridge, "-j", "REJECT"]]:
        subprocess.run(["iptables", "-I", "INPUT", *rule], check=True)
    container = docker_client.containers.create(node_image, ["sleep", "300"], network="polar-orphan-test",
                                                labels={LABEL: "orphan", OWNER: owner})
    live = docker_client.containers.create(node_image, ["sleep", "300"],
                                           labels={LABEL: "alive", OWNER: f"{__import__('socket').gethostname()}:1"})
    try:
        assert reap_orphans(docker_client) >= 2
        ids = {c.id for c in docker_client.containers.list(all=True)}
        assert container.id not in ids and live.id in ids  # pid 1 lives: its container stays
        assert not docker_client.networks.list(names=["polar-orphan-test"])
        left = subprocess.run(["iptables", "-S", "INPUT"], capture_output=True, text=True).stdout
        assert f"-i {bridge} " not in left and f"-i {gone_bridge} " not in left
    finally:
        live.remove(force=True)
