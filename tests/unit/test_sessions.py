"""Session identification and secret handling."""

from polar.sessions import SessionRegistry, client_key, redact


def test_resolution_order():
    reg = SessionRegistry(salt=b"x")
    reg.register_key("sk-session-7", "s7")
    reg.register_address("10.1.2.3", "container-3")
    h = {"x-api-key": "sk-session-7"}
    assert reg.resolve("/v1/messages", {**h, "x-polar-session": "explicit"}, "10.1.2.3").session == "explicit"
    ident = reg.resolve("/s/run-42/v1/messages", h, "10.1.2.3")
    assert (ident.session, ident.path, ident.source) == ("run-42", "/v1/messages", "path")
    assert reg.resolve("/v1/messages", h, "10.1.2.3").session == "s7"
    assert reg.resolve("/v1/messages", {}, "10.1.2.3").session == "container-3"
    anon = reg.resolve("/v1/messages", {"authorization": "Bearer other"}, None)
    assert anon.session.startswith("key-") and "other" not in anon.session


def test_secrets_are_hashed_and_redacted():
    reg = SessionRegistry(salt=b"x")
    ident = reg.resolve("/", {"x-goog-api-key": "AIza-secret"}, None)
    assert ident.key_hash and "AIza-secret" not in ident.key_hash
    assert client_key({"authorization": "Bearer tok"}) == "tok"
    assert redact({"authorization": "Bearer tok", "x-api-key": "k", "accept": "*/*"}) == {
        "authorization": "<redacted>", "x-api-key": "<redacted>", "accept": "*/*"}
