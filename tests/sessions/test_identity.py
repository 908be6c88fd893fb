"""Session identification and secret handling."""

from polar.sessions.identity import SessionRegistry, client_key, redact


def test_resolution_order():
    reg = SessionRegistry(salt=b"x")
    reg.register_key("sk-session-7", "s7")
    reg.register_address("10.1.2.3", "container-3")
    # Unbound clients name their session: header first, then the /s/<id>/ path prefix.
    assert reg.resolve("/s/run-42/v1/messages", {"x-polar-session": "explicit"}, None).session == "explicit"
    ident = reg.resolve("/s/run-42/v1/messages", {}, "10.9.9.9")
    assert (ident.session, ident.path, ident.source) == ("run-42", "/v1/messages", "path")
    # Bound clients: a registered key, then a registered address.
    h = {"x-api-key": "sk-session-7"}
    assert reg.resolve("/v1/messages", h, "10.1.2.3").session == "s7"
    assert reg.resolve("/v1/messages", {}, "10.1.2.3").session == "container-3"
    anon = reg.resolve("/v1/messages", {"authorization": "Bearer other"}, None)
    assert anon.session.startswith("key-") and "other" not in anon.session


def test_bound_clients_cannot_name_another_session():
    reg = SessionRegistry(salt=b"x")
    reg.register_key("k1", "one")
    reg.register_address("10.0.0.7", "seven")
    by_key = reg.resolve("/v1/messages", {"x-polar-session": "other", "x-api-key": "k1"}, None)
    assert (by_key.session, by_key.refused, by_key.source) == ("one", "other", "key")
    by_addr = reg.resolve("/s/other/v1/messages", {}, "10.0.0.7")
    assert (by_addr.session, by_addr.refused, by_addr.path) == ("seven", "other", "/v1/messages")
    same = reg.resolve("/s/seven/v1/messages", {}, "10.0.0.7")  # naming its own session is fine
    assert (same.session, same.refused, same.source) == ("seven", None, "path")
    reg.forget_key("k1")  # a session's key dies with it
    assert reg.resolve("/v1/messages", {"x-api-key": "k1"}, None).session.startswith("key-")


def test_a_session_s_dropped_messages_policy_is_set_by_its_runtime_and_forgotten_with_its_key():
    import pytest

    reg = SessionRegistry(salt=b"x")
    reg.register_key("k1", "one")
    assert reg.dropped_messages("one") is None  # the gateway's option decides
    reg.set_dropped_messages("one", "keep")
    assert (reg.dropped_messages("one"), reg.dropped_messages("two")) == ("keep", None)
    with pytest.raises(ValueError, match="splice or keep"):
        reg.set_dropped_messages("one", "drop")
    reg.forget_key("k1")
    assert reg.dropped_messages("one") is None


def test_secrets_are_hashed_and_redacted():
    reg = SessionRegistry(salt=b"x")
    ident = reg.resolve("/", {"x-goog-api-key": "AIza-secret"}, None)
    assert ident.key_hash and "AIza-secret" not in ident.key_hash
    assert client_key({"authorization": "Bearer tok"}) == "tok"
    assert redact({"authorization": "Bearer tok", "x-api-key": "k", "accept": "*/*"}) == {
        "authorization": "<redacted>", "x-api-key": "<redacted>", "accept": "*/*"}
