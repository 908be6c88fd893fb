"""An option change rebuilds only the part it touches, as mitmproxy's own addons do."""

from __future__ import annotations

import contextlib

from mitmproxy.test import taddons

from polar.mitm.addon import GatewayAddon


@contextlib.contextmanager
def _master(addon: GatewayAddon):
    """mitmproxy's test context (conftest.py puts the real one back afterwards)."""
    with taddons.context(addon) as context:
        yield context


def test_each_option_rebuilds_only_its_part(tmp_path, tokenizer_dir, monkeypatch):
    monkeypatch.chdir(tmp_path)  # loading configures every option once, the default database included
    addon = GatewayAddon()
    with _master(addon) as tctx:
        tctx.configure(addon, polar_db=str(tmp_path / "a.db"), polar_upstream="http://127.0.0.1:9")
        first = addon.gateway
        registry, gate, states = first.registry, addon.gate, first.states
        first.registry.register_key("sk-session-key", "s1")

        tctx.configure(addon, polar_max_body=1234, polar_model_aliases=["alias"], polar_dropped_messages="keep")
        assert addon.gateway is first and first.max_body_bytes == 1234 and first.model_aliases == ["alias"]
        assert first.dropped_messages == "keep"

        tctx.configure(addon, polar_db_sync="NORMAL", polar_db_busy_timeout=2)
        assert addon.gateway is first and first.writer.synchronous == "NORMAL" and first.writer.busy_timeout == 2

        tctx.configure(addon, polar_upstream="http://127.0.0.1:10")
        second = addon.gateway
        assert second is not first and second.writer is first.writer and second.backend is not first.backend
        assert second.states is states and second.gate is gate and second.registry is registry

        tctx.configure(addon, polar_tokenizer=str(tokenizer_dir))  # other prompt ids: the token state goes
        third = addon.gateway
        assert third.writer is first.writer and third.states is not states
        assert type(third.backend).__name__ == "TokenFaithful"
        # long text's fast path is built as the proxy starts, not during its first agent-sized calls
        assert third.backend.template._encode._building and third.backend.template._encode.ascii_path(timeout=120)

        old_hash = registry.hash_key("sk-session-key")
        tctx.configure(addon, polar_db=str(tmp_path / "b.db"))
        fourth = addon.gateway
        assert fourth.writer is not first.writer and fourth.writer.path.endswith("b.db")
        assert fourth.registry is registry and fourth.gate is gate  # runtimes and trainers hold these
        assert registry.hash_key("sk-session-key") != old_hash  # re-hashed under the new database's salt
        assert registry.resolve("/v1/messages", {"x-api-key": "sk-session-key"}, None).session == "s1"
        assert addon._retired == []  # nothing in flight: the replaced parts are closed at once
        assert first.writer._thread is None  # closed


def test_hot_sessions_size_every_per_session_cache_of_the_live_gateway(tmp_path, monkeypatch):
    from mitmproxy import exceptions

    from polar.capture.working_set import AGENT_BODY_BYTES, DEFAULT

    monkeypatch.chdir(tmp_path)
    addon = GatewayAddon()
    with _master(addon) as tctx:
        tctx.configure(addon, polar_db=str(tmp_path / "a.db"), polar_upstream="http://127.0.0.1:9")
        gateway = addon.gateway
        assert gateway.histories.max_bytes == DEFAULT.history_bytes
        assert [b.max_bytes for b in gateway.writer._bases] == [DEFAULT.base_bytes] * 2

        tctx.configure(addon, polar_hot_sessions=3000)  # a node with the memory for 3,000 agents at once
        assert addon.gateway is gateway  # resized in place: nothing kept is lost
        assert gateway.histories.max_bytes == 3000 * AGENT_BODY_BYTES
        assert [b.max_bytes for b in gateway.writer._bases] == [3000 * AGENT_BODY_BYTES] * 2
        assert gateway.states.max_sessions == 6000 and gateway.states.max_tokens > DEFAULT.state_tokens

        tctx.configure(addon, polar_upstream="http://127.0.0.1:10")  # a new gateway keeps the size
        assert addon.gateway is not gateway and addon.gateway.histories.max_bytes == 3000 * AGENT_BODY_BYTES

        try:
            tctx.configure(addon, polar_hot_sessions=0)
        except exceptions.OptionsError as exc:
            assert "at least 1" in str(exc)
        else:
            raise AssertionError("polar_hot_sessions=0 was accepted")
        assert addon.gateway.histories.max_bytes == 3000 * AGENT_BODY_BYTES


def test_a_value_outside_an_options_choices_is_refused(tmp_path, monkeypatch):
    """mitmproxy's `--set` does not hold a value to the option's choices: a mistyped commit mode would have
    captured with another one, silently."""
    from mitmproxy import exceptions

    monkeypatch.chdir(tmp_path)
    addon = GatewayAddon()
    with _master(addon) as tctx:
        tctx.configure(addon, polar_db=str(tmp_path / "a.db"), polar_upstream="http://127.0.0.1:9")
        for name, value in (("polar_db_sync", "OFF"), ("polar_token_endpoint", "chat")):
            try:
                tctx.configure(addon, **{name: value})
            except exceptions.OptionsError as exc:
                assert name in str(exc) and repr(value) in str(exc)
            else:
                raise AssertionError(f"{name}={value} was accepted")
        assert addon.gateway.writer.synchronous == "FULL"


def test_polar_proxy_says_which_set_value_it_refuses(tmp_path):
    import subprocess
    import sys

    for setting, said in (("polar_db_sync=BAD", "polar_db_sync must be one of FULL, NORMAL, not 'BAD'"),
                          ("polar_hot_sessions=0", "polar_hot_sessions must be at least 1, not 0")):
        run = subprocess.run([sys.executable, "-m", "polar.cli", "proxy", "--upstream", "http://127.0.0.1:9",
                              "--port", "0", "--db", str(tmp_path / "c.db"), "--set", setting],
                             capture_output=True, text=True, timeout=120)
        assert run.returncode == 1 and f"Error: {said}" in run.stderr, run.stderr[-2000:]
        assert "Traceback" not in run.stderr
