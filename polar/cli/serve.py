"""`polar proxy`, `polar double`, `polar captures`: run the gateway, the scripted double, list captures."""

from __future__ import annotations

import asyncio
import json
import secrets
from pathlib import Path

import click

from polar.cli.options import gateway_flags, gateway_values
from polar.cli.paths import DEFAULT_TOKENIZER
from polar.cli.upstreams import add_upstream_file, upstream_file_option
from polar.config.options import default


@click.command()
@gateway_flags()
@upstream_file_option
@click.option(
    "--mode", type=click.Choice(["reverse", "regular"]), default="reverse", show_default=True,
    help="reverse: clients set their base URL to polar. regular: clients use polar as HTTP(S)_PROXY.",
)
@click.option("--host", default="127.0.0.1", show_default=True, help="Listen address.")
@click.option("--port", default=8080, show_default=True, type=int)
@click.option("--web/--no-web", default=False, help="Run mitmweb (inspect every call in a browser) instead of mitmdump.")
@click.option("--web-port", default=8081, show_default=True, type=int)
@click.option("--set", "sets", multiple=True, metavar="OPTION=VALUE",
              help="Any further mitmproxy option (or a polar_* one, by its mitmproxy name).")
@click.option("--workers", default=1, show_default=True, type=click.IntRange(min=1),
              help="Gateway processes (one core each) behind one address, every session on one of them (haproxy "
                   "front, reverse mode); worker k captures into DB.wk.db (captures.db → captures.w0.db, …).")
def proxy(mode, host, port, web, web_port, sets, workers, upstream_file, **options) -> None:
    """Run the gateway: mitmproxy + the polar addons in front of a vLLM server (or a fleet of replicas)."""
    from polar.mitm.proxy import ProxyConfig, serve

    add_upstream_file(options, upstream_file)
    extra = {}
    for item in sets:
        key, sep, value = item.partition("=")
        if not sep:
            raise click.BadParameter(f"expected OPTION=VALUE, got {item!r}", param_hint="--set")
        extra[key] = value
    web_url = ""
    if web and "web_password" not in extra:
        # mitmweb refuses requests without its token; choose it here so the URL can be printed.
        extra["web_password"] = secrets.token_urlsafe(16)
        web_url = f"; mitmweb on http://{host}:{web_port}/?token={extra['web_password']}"
    config = ProxyConfig(mode=mode, host=host, port=port, web=web, web_port=web_port, extra=extra,
                         **gateway_values(options))
    if workers > 1:
        raise SystemExit(_serve_workers(config, workers))
    click.echo(f"polar {mode} proxy on http://{host}:{port} → {config.upstream}; captures in {config.db}{web_url}")
    from mitmproxy.exceptions import OptionsError

    try:
        asyncio.run(serve(config))
    except OptionsError as exc:  # a --set value polar refuses: say so, without a traceback
        raise click.ClickException(str(exc)) from None


def _serve_workers(config, count: int) -> int:
    from polar.capture.shards import shard_path
    from polar.supervise.workers import WorkerSet

    try:
        workers = WorkerSet(config, count)
        workers.start()
    except (ValueError, RuntimeError) as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"polar reverse proxy on http://{config.host}:{config.port} → {config.upstream}; {count} workers, "
               f"each session on one; captures in {shard_path(config.db, 0)} … {shard_path(config.db, count - 1)}")
    for line in workers.describe():
        click.echo(line)
    return workers.run()


@click.command()
@click.option("--tokenizer", "tokenizer_dir", default=str(DEFAULT_TOKENIZER), show_default=True,
              type=click.Path(exists=True, file_okay=False), help="Hugging Face tokenizer directory (with chat template).")
@click.option("--model-name", default="polar-tiny", show_default=True, help="Served model name.")
@click.option("--script", "script_path", type=click.Path(exists=True, dir_okay=False), help="JSON script of answers.")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8000, show_default=True, type=int)
@click.option("--max-model-len", default=32768, show_default=True, type=int)
@click.option("--token-delay", default=0.0, show_default=True, type=click.FloatRange(min=0),
              help="Seconds per sampled token (streams are paced by it; a plain answer takes the sum).")
@click.option("--first-token-delay", default=0.0, show_default=True, type=click.FloatRange(min=0),
              help="Seconds before the first token (queue and prefill).")
def double(tokenizer_dir, model_name, script_path, host, port, max_model_len, token_delay, first_token_delay) -> None:
    """Serve the scripted vLLM TEST DOUBLE (real tokenizer, scripted answers)."""
    import uvicorn

    from polar.doubles.scripted_vllm import Script, ScriptedVLLM

    script = Script.from_json(json.loads(Path(script_path).read_text())) if script_path else None
    app = ScriptedVLLM(tokenizer_dir, model_name, max_model_len=max_model_len, script=script,
                       token_delay_s=token_delay, first_token_delay_s=first_token_delay).app
    uvicorn.run(app, host=host, port=port, log_level="warning")


@click.command()
@click.option("--db", default=default("polar_db"), show_default=True, type=click.Path(dir_okay=False),
              help="Capture database; with `polar proxy --workers`, the --db it got reads every worker's shard.")
@click.option("--session", help="Only this session.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per call, with token ids.")
def captures(db, session, as_json) -> None:
    """List captured model calls."""
    from polar.capture.shards import open_captures
    from polar.reporting.table import captures_table
    from polar.sqlite_files import WrongDatabase

    try:
        store = open_captures(db)
    except WrongDatabase as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        for row in store.calls(session=session):
            row = {k: v for k, v in row.items() if not isinstance(v, bytes)}
            click.echo(json.dumps(row, ensure_ascii=False))
    else:
        captures_table(store.calls(session=session, with_tokens=False))
