"""`polar rollout serve` and `polar submit tasks.jsonl`: the rollout service from the command line."""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path

import click

from polar.cli.options import gateway_flags, gateway_values
from polar.cli.upstreams import add_upstream_file, upstream_file_option
from polar.rollout.client import DEFAULT_URL, RolloutClient
from polar.rollout.node import GatewayNode, NodeConfig
from polar.rollout.state import RolloutState
from polar.rollout.tasks import SessionResult, load_tasks

# The gateway options the embedded gateway (and each Ray node's) takes from the command line.
EMBEDDED_OPTIONS = ("polar_upstream", "polar_upstream_model", "polar_tokenizer", "polar_db", "polar_upstream_stall")
STAGES = ("queued", "init", "ready", "running", "postrun", "done")


@click.group("rollout")
def rollout() -> None:
    """The rollout service: tasks in, scored trajectories out."""


@rollout.command()
@click.option("--host", default="127.0.0.1", show_default=True,
              help="API listen address (beyond loopback needs --token).")
@click.option("--port", default=8090, show_default=True, type=int)
@click.option("--token", envvar="POLAR_ROLLOUT_TOKEN", default=None, help="Bearer token trainers must send.")
@click.option("--state", "state_path", default="rollout.db", show_default=True, help="Rollout state (SQLite).")
@gateway_flags(EMBEDDED_OPTIONS)
@upstream_file_option
@click.option("--proxy-port", default=8080, show_default=True, type=int, help="Port of the embedded polar gateway.")
@click.option("--init", "init_workers", default=2, show_default=True, type=int)
@click.option("--ready", "ready_size", default=4, show_default=True, type=int)
@click.option("--running", "running_slots", default=4, show_default=True, type=int)
@click.option("--postrun", "postrun_workers", default=2, show_default=True, type=int)
@click.option("--max-staleness", default=None, type=int, help="Refuse sessions more than K policy versions behind.")
@click.option("--docker/--no-docker", default=False, help="Also offer the docker runtime (transparent capture).")
@click.option("--allow-open-egress", is_flag=True, envvar="POLAR_ALLOW_OPEN_EGRESS",
              help="Run docker sandboxes even if their host-port lock (iptables) cannot be installed.")
@click.option("--node-grace", default=60.0, show_default=True, type=float,
              help="Seconds a node's event stream may keep failing before its sessions move to healthy nodes "
                   "(a Ray machine that died moves them at once).")
@click.option("--ray", "ray_address", default=None, metavar="ADDRESS",
              help="Run the nodes as Ray actors on this cluster ('auto': the one this machine belongs to).")
@click.option("--ray-per-node", default=1, show_default=True, type=int, help="Node actors per Ray machine.")
@click.option("--ray-cpus", default=1.0, show_default=True, type=float, help="CPUs each node actor declares.")
@click.option("--simulate", default=None, type=float, metavar="SCALE",
              help="Dry run: sessions only sleep for their task's metadata.sim durations (× SCALE); no gateway.")
@click.option("--watchdog", default=None, metavar="JSON", callback=lambda ctx, param, v: _watchdog(v),
              help='The long-tail cut for every session (a task\'s "watchdog" overrides it), e.g. '
                   '\'{"repeated_tool_calls": 8, "stall_seconds": 300, "token_budget": 200000}\' (docs/tasks.md).')
def serve(host, port, token, state_path, proxy_port, init_workers, ready_size, running_slots, postrun_workers,
          max_staleness, docker, allow_open_egress, node_grace, ray_address, ray_per_node, ray_cpus, simulate,
          upstream_file, watchdog, **options) -> None:
    """Run the rollout server with one embedded gateway node (polar + the local and, optionally, docker runtimes).
    Several --upstream: the gateway (each Ray node's) routes over that fleet of replicas."""
    from polar.rollout.server import check_binding
    from polar.rollout.server import serve as serve_api
    from polar.rollout.service import LocalNode, RolloutService

    try:
        check_binding(host, token)
    except ValueError as exc:  # said as the CLI says a bad flag, not as a traceback
        raise click.UsageError(f"{exc} (--token, or $POLAR_ROLLOUT_TOKEN)") from None
    add_upstream_file(options, upstream_file)
    gateway = gateway_values(options, EMBEDDED_OPTIONS)  # upstream, upstream_model, tokenizer, db, upstream_stall
    config = NodeConfig(init_workers=init_workers, ready_size=ready_size, running_slots=running_slots,
                        postrun_workers=postrun_workers, max_staleness=max_staleness, watchdog=watchdog)
    if ray_address:
        phases = {"kind": "simulated", "scale": simulate} if simulate is not None else {
            "kind": "gateway", **gateway, "db": str(Path(gateway["db"]).resolve()), "port": 0, "docker": docker,
            "allow_open_egress": allow_open_egress}
        return _serve_on_ray(ray_address, config, phases, ray_per_node, ray_cpus, state_path, host, port, token,
                             node_grace)
    proxy, runtimes = None, []
    if simulate is not None:
        from polar.rollout.simulate import SimulatedPhases

        phases, capture_db = SimulatedPhases(simulate), None
    else:
        from polar.rollout.lifecycle import SessionPhases, embedded_gateway
        from polar.sandboxes.base import RuntimeUnavailable

        try:
            proxy, env = embedded_gateway(gateway["upstream"], gateway["db"], proxy_port, gateway["upstream_model"],
                                          gateway["tokenizer"], docker, allow_open_egress, gateway["upstream_stall"])
        except RuntimeUnavailable as err:  # e.g. the sandbox network's egress lock: said plainly, no traceback
            raise click.ClickException(str(err)) from err
        phases, capture_db, runtimes = SessionPhases(env, config), gateway["db"], list(env.runtimes.values())

    async def main() -> None:
        service = RolloutService(RolloutState(state_path), [LocalNode(GatewayNode(phases, config), capture_db)],
                                 node_grace=node_grace)
        click.echo(f"rollout server on http://{host}:{port} (state {state_path})")
        await serve_api(service, host, port, token)

    try:
        asyncio.run(main())
    finally:
        for runtime in runtimes:
            runtime.close()
        if proxy is not None:
            proxy.stop()


@rollout.command()
@click.option("--state", "state_path", default="rollout.db", show_default=True,
              type=click.Path(exists=True, dir_okay=False), help="Rollout state (SQLite).")
@click.option("--out", required=True, type=click.Path(dir_okay=False), help="Trajectories file (.jsonl or .parquet).")
@click.option("--task", "task_ids", multiple=True, help="Only these tasks.")
def export(state_path, out, task_ids) -> None:
    """Write every scored trajectory in the rollout state to a file (rewards included)."""
    from polar.trajectories.io import write

    trajectories = [t for r in RolloutState(state_path).all_results() if not task_ids or r.task_id in task_ids
                    for t in r.trajectories]
    click.echo(f"{write(trajectories, out)} trajectories written to {out}")


@rollout.command()
@click.option("--server", default=None, help=f"Rollout server URL (default $POLAR_ROLLOUT_URL or {DEFAULT_URL}).")
@click.option("--token", envvar="POLAR_ROLLOUT_TOKEN", default=None)
def status(server, token) -> None:
    """The server's status as JSON: sessions per stage, outcomes, rewards, nodes (health included),
    policy version. Unhealthy nodes are also named on stderr."""
    import json

    with RolloutClient(server, token) as client:
        status = client.status()
    click.echo(json.dumps(status, indent=2))
    for line in unhealthy_lines(status):
        click.echo(f"warning: {line}", err=True)


def _watchdog(text: str | None):
    from polar.rollout.tasks import WatchdogOptions

    try:
        return WatchdogOptions.model_validate_json(text) if text else None
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--watchdog") from None


def unhealthy_lines(status: dict) -> list[str]:
    """One line per node the service cannot hear (or has lost for good): since when and why; one per upstream
    replica a node's fleet has taken out."""
    lines = [f"node {n.get('node')} lost since {n.get('unhealthy_since')}: {n.get('last_error')}" if n.get("lost")
             else f"node {n.get('node')} unhealthy since {n.get('unhealthy_since')} ({n.get('failures')} failures): "
             f"{n.get('last_error')}" for n in status.get("nodes", []) if n.get("healthy") is False]
    return lines + [f"node {n.get('node')}: upstream replica {r['url']} out since {r.get('out_since')}: "
                    f"{r.get('last_error')}" for n in status.get("nodes", [])
                    for r in (n.get("fleet") or {}).get("replicas", []) if not r.get("up")]


def _serve_on_ray(address: str, config: NodeConfig, phases: dict, per_node: int, cpus: float, state_path: str,
                  host: str, port: int, token: str | None, node_grace: float) -> None:
    import ray

    from polar.rollout.ray_nodes import launch_nodes
    from polar.rollout.server import serve as serve_api
    from polar.rollout.service import RolloutService

    ray.init(address=address)
    nodes = launch_nodes(config, phases, {"num_cpus": cpus}, per_node)
    click.echo(f"{len(nodes)} node actors on {len(ray.nodes())} Ray machines")

    async def main() -> None:
        service = RolloutService(RolloutState(state_path), nodes, node_grace=node_grace)
        click.echo(f"rollout server on http://{host}:{port} (state {state_path})")
        await serve_api(service, host, port, token)

    asyncio.run(main())


@click.command()
@click.argument("tasks_file", type=click.Path(exists=True, dir_okay=False))
@click.option("--server", default=None, help=f"Rollout server URL (default $POLAR_ROLLOUT_URL or {DEFAULT_URL}).")
@click.option("--token", envvar="POLAR_ROLLOUT_TOKEN", default=None)
@click.option("--ack/--no-ack", default=False, show_default=True,
              help="Mark the results drained (leave them for a trainer otherwise).")
@click.option("--wait/--no-wait", default=True, show_default=True, help="Follow the tasks until every session ends.")
def submit(tasks_file, server, token, ack, wait) -> None:
    """Submit tasks (JSONL) to the rollout server and follow them live."""
    tasks = load_tasks(tasks_file)
    with RolloutClient(server, token) as client:
        if not client.health():
            raise click.ClickException(f"no rollout server answers at {client.url} (start one: polar rollout serve)")
        accepted = client.submit(tasks)
        sessions = {s: a["task_id"] for a in accepted for s in a["sessions"]}
        click.echo(f"submitted {len(accepted)} tasks, {len(sessions)} sessions")
        if wait:
            from rich.console import Console

            console = Console()
            console.print(summary_table(_follow(client, sessions, ack, token, console)))


def _follow(client: RolloutClient, sessions: dict[str, str], ack: bool, token: str | None,
            console) -> list[SessionResult]:
    """Live progress until every session has a result (a second connection streams them in)."""
    from rich.live import Live

    inbox: queue.Queue[SessionResult | Exception] = queue.Queue()
    threading.Thread(target=_stream, args=(client.url, token, set(sessions), ack, inbox), daemon=True).start()
    results: list[SessionResult] = []
    started = time.monotonic()
    with Live(console=console, refresh_per_second=4) as live:
        while len(results) < len(sessions):
            try:
                item = inbox.get(timeout=0.5)
            except queue.Empty:
                item = None
            if isinstance(item, Exception):
                raise click.ClickException(f"lost the result stream: {item}")
            if item is not None:
                results.append(item)
            live.update(progress_table(client.status(), results, len(sessions), time.monotonic() - started))
    return results


def _stream(url: str, token: str | None, wanted: set[str], ack: bool, inbox: queue.Queue) -> None:
    try:
        with RolloutClient(url, token) as client:
            for seq, result in client.results(follow=True, ack=False):
                if result.session_id in wanted:
                    wanted.discard(result.session_id)
                    inbox.put(result)
                    if ack:
                        client.ack([seq])
                    if not wanted:
                        return
    except Exception as exc:  # reported by the main thread, which owns the terminal
        inbox.put(exc)


def progress_table(status: dict, results: list[SessionResult], total: int, elapsed: float):
    from rich.table import Table

    table = Table(title=f"rollout: {len(results)}/{total} sessions done", show_edge=False)
    for stage in STAGES:
        table.add_column(stage, justify="right")
    table.add_column("sessions/h", justify="right")
    table.add_column("reward (mean, n)", justify="right")
    stages = status.get("stages", {})
    rewards = [r.reward for r in results if r.reward is not None]
    mean = f"{sum(rewards) / len(rewards):.3f}, {len(rewards)}" if rewards else "-"
    rate = len(results) / elapsed * 3600 if elapsed else 0.0
    table.add_row(*[str(stages.get(s, 0)) for s in STAGES], f"{rate:.0f}", mean)
    table.caption = "\n".join(unhealthy_lines(status)) or None
    return table


def summary_table(results: list[SessionResult]):
    from rich.table import Table

    by_task: dict[str, list[SessionResult]] = defaultdict(list)
    for r in results:
        by_task[r.task_id].append(r)
    table = Table(title="rollout summary")
    for name in ("task", "sessions", "outcomes", "mean reward", "solved", "turns", "trainable tokens"):
        table.add_column(name, justify="left" if name in ("task", "outcomes") else "right", overflow="fold")
    for task_id, rs in sorted(by_task.items()):
        outcomes = Counter(r.outcome for r in rs)
        rewards = [r.reward for r in rs if r.reward is not None]
        table.add_row(
            task_id, str(len(rs)), " ".join(f"{k}={v}" for k, v in sorted(outcomes.items())),
            f"{sum(rewards) / len(rewards):.3f}" if rewards else "-",
            str(sum(1 for x in rewards if x >= 1.0)),
            str(sum(len(t.turns) for r in rs for t in r.trajectories)),
            str(sum(t.trainable_tokens for r in rs for t in r.trajectories)),
        )
    return table


def main() -> None:  # `python -m polar.cli.rollout …` (tests, before the lead registers the commands)
    group = click.Group(commands={"rollout": rollout, "submit": submit})
    group(prog_name="polar", auto_envvar_prefix=None)


if __name__ == "__main__":
    main()
