"""Debian packages for image layers, resolved by the host's apt (polar/sandboxes/debs.py)."""

from __future__ import annotations

from polar.sandboxes.debs import closure, download


def test_nothing_missing_downloads_nothing(tmp_path, monkeypatch):
    """A layer whose packages the parent has already gets an empty directory: no apt call, nothing to install."""
    monkeypatch.setenv("POLAR_CACHE", str(tmp_path))
    target = download({})
    assert target.is_dir() and (target / ".done").exists() and not list(target.glob("*.deb"))
    assert download({}) == target


def test_closure_holds_the_package_and_what_it_needs():
    """tmux (OpenHands' terminal tool drives it) with its libraries, at the versions the host's apt would pick."""
    versions = closure(["tmux"])
    assert "tmux" in versions and any(name.startswith("libevent") for name in versions)
    assert all(version[0].isdigit() for version in versions.values())
