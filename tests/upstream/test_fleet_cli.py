"""`polar proxy` and `polar rollout serve` take a fleet: --upstream repeated, --upstream-file; bad URLs are
refused before anything starts. (Serving itself is tests/upstream/test_fleet_doubles.py.)"""

from __future__ import annotations

from click.testing import CliRunner

from polar.cli import main


def test_polar_proxy_joins_repeated_upstreams_and_a_file_into_one_option(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the default --db is captures.db in the working directory
    started = []

    async def serve(config, *args, **kwargs):
        started.append(config)

    monkeypatch.setattr("polar.mitm.proxy.serve", serve)
    listing = tmp_path / "fleet.txt"
    listing.write_text("http://10.0.0.3:8000\n# a comment\nhttp://10.0.0.1:8000\n")
    out = CliRunner().invoke(main, ["proxy", "--upstream", "http://10.0.0.1:8000", "--upstream",
                                    "http://10.0.0.2:8000", "--upstream-file", str(listing), "--db",
                                    str(tmp_path / "c.db")])
    assert out.exit_code == 0, out.output
    (config,) = started
    assert config.upstream == "http://10.0.0.1:8000,http://10.0.0.2:8000,http://10.0.0.3:8000"
    assert config.polar_options()["polar_upstream"] == config.upstream
    assert config.mitm_options()["mode"] == ["reverse:http://10.0.0.1:8000@8080"]
    out = CliRunner().invoke(main, ["proxy"])  # nothing given: the default upstream
    assert out.exit_code == 0 and started[-1].upstream == "http://127.0.0.1:8000"


def test_a_bad_upstream_is_refused_by_both_commands():
    for command in (["proxy"], ["rollout", "serve"]):
        out = CliRunner().invoke(main, [*command, "--upstream", "http://ok:1", "--upstream", "10.0.0.9:8000"])
        assert out.exit_code == 2 and "an upstream must be an http(s) base URL, not '10.0.0.9:8000'" in out.output
