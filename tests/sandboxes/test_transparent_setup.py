"""polar's side of transparent capture and the image recipes' inputs, without Docker."""

from __future__ import annotations

from pathlib import Path

import pytest

from polar.mitm.proxy import ProxyConfig
from polar.mitm.transparent import ca_cert_path, ensure_ca, transparent_modes, with_transparent
from polar.sandboxes.images import RECIPES, _recipe_digest, debian_mirror


def test_transparent_listeners_keep_the_proxys_own():
    from mitmproxy.proxy.mode_specs import ProxyMode

    config = with_transparent(ProxyConfig(port=8123, extra={"polar_upstream_timeout": 5.0}), "172.30.0.1")
    modes = [ProxyMode.parse(spec) for spec in config.extra["mode"]]
    listen_host = config.mitm_options()["listen_host"]
    assert [(m.type_name, m.listen_host(listen_host), m.listen_port()) for m in modes] == [
        ("reverse", "127.0.0.1", 8123),  # the listener BackgroundProxy waits on
        ("reverse", "172.30.0.1", 443),
        ("reverse", "172.30.0.1", 80),
    ]
    assert config.extra["keep_host_header"] is True and config.extra["polar_upstream_timeout"] == 5.0
    assert config.mitm_options()["connection_strategy"] == "lazy" and config.mitm_options()["upstream_cert"] is False
    assert transparent_modes("10.0.0.1", https_port=8443, http_port=None) == ["reverse:https://polar.invalid@10.0.0.1:8443"]


def test_ensure_ca_hands_out_the_certificate_only(tmp_path):
    cert = ensure_ca(tmp_path)
    assert cert == ca_cert_path(tmp_path) and cert.name == "mitmproxy-ca-cert.pem"
    assert "BEGIN CERTIFICATE" in cert.read_text() and "PRIVATE KEY" not in cert.read_text()
    assert "PRIVATE KEY" in (tmp_path / "mitmproxy-ca.pem").read_text()  # the key stays beside it
    before = cert.read_bytes()
    assert ensure_ca(tmp_path).read_bytes() == before  # an existing CA is kept


@pytest.mark.parametrize(
    "name, text, expected",
    [
        (
            "debian.sources",
            "Types: deb\n# a comment\nURIs: http://mirror.example/debian\nSuites: bookworm bookworm-updates\n"
            "Components: main\n\nTypes: deb\nURIs: http://mirror.example/debian-security\nSuites: bookworm-security\n",
            "http://mirror.example/debian",
        ),
        (
            "extra.list",
            "# deb http://old.example/debian bookworm main\ndeb [arch=amd64] http://one.example/debian bookworm main\n",
            "http://one.example/debian",
        ),
    ],
)
def test_debian_mirror_comes_from_apts_own_sources(tmp_path, name, text, expected):
    (tmp_path / "sources.list.d").mkdir()
    (tmp_path / "sources.list").write_text("deb http://vendor.example/apt cloud-sdk-bookworm main\n")
    (tmp_path / "sources.list.d" / name).write_text(text)
    assert debian_mirror("bookworm", apt_dir=tmp_path) == expected
    with pytest.raises(RuntimeError, match="no Debian mirror for 'trixie'"):
        debian_mirror("trixie", apt_dir=tmp_path)


def test_image_tags_follow_their_recipes(tmp_path):
    recipe = tmp_path / "layer"
    recipe.mkdir()
    (recipe / "Dockerfile").write_text("ARG PARENT\nFROM ${PARENT}\n")
    first = _recipe_digest(recipe, "parent:1")
    assert _recipe_digest(recipe, "parent:1") == first
    assert _recipe_digest(recipe, "parent:2") != first  # a new parent rebuilds the layer
    (recipe / "Dockerfile").write_text("ARG PARENT\nFROM ${PARENT}\nRUN true\n")
    assert _recipe_digest(recipe, "parent:1") != first
    for layer in ("base", "node", "ca"):
        assert any(Path(RECIPES / layer).iterdir())
