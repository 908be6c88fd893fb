"""`polar rollout serve` refuses a bad set-up as a CLI error (usage, exit 2), never with a traceback."""

from __future__ import annotations

from click.testing import CliRunner

from polar.cli.rollout import serve


def test_listening_beyond_loopback_without_a_token_is_a_usage_error(monkeypatch):
    monkeypatch.delenv("POLAR_ROLLOUT_TOKEN", raising=False)
    run = CliRunner().invoke(serve, ["--host", "0.0.0.0", "--simulate", "1"])
    assert run.exit_code == 2 and run.exception is not None and isinstance(run.exception, SystemExit)
    assert "0.0.0.0 (beyond loopback) requires a token" in run.output and "--token" in run.output
    assert "Traceback" not in run.output
