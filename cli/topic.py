"""``txbroker topic``: create, update, delete and list topics."""

from __future__ import annotations

import click
import orjson
from rich.console import Console
from rich.table import Table

from txbroker.cli.common import (
    CommandError,
    credentials_options,
    is_system_topic,
    namesrv_option,
    run,
)
from txbroker.client.admin import AdminClient
from txbroker.client.errors import TopicExistsError, TopicShrinkError

#: ``--perm`` choices: RocketMQ's PermName bits (READ=4, WRITE=2; INHERIT=1 is kept as it is).
PERMS = {"rw": 6, "r-": 4, "-w": 2}


def perm_text(perm: int) -> str:
    """RocketMQ's PermName bits as ``rw`` / ``r-`` / ``-w`` / ``--``."""
    return ("r" if perm & 4 else "-") + ("w" if perm & 2 else "-")


@click.group()
def topic() -> None:
    """Create, update, delete and list topics."""


@topic.command()
@click.argument("name")
@click.option("--queues", default=4, show_default=True, type=click.IntRange(1, 1024),
              help="Read and write queues.")
@click.option("--cluster", default=None,
              help="Create it on every master of this cluster (e.g. DefaultCluster), reporting "
                   "per broker; a broker that has it already keeps it unchanged.")
@namesrv_option
@credentials_options
def create(name: str, queues: int, cluster: str | None, namesrv: str,
           credentials: dict[str, str]) -> None:
    """Create topic NAME (an existing topic is refused: see 'txbroker topic update')."""

    async def main() -> tuple[dict[str, str], dict[str, str]]:
        async with AdminClient(namesrv, **credentials) as admin:
            try:
                return await admin.create_topic(name, queues, cluster=cluster), admin.brokers
            except TopicExistsError as exc:
                raise CommandError("topic create", exc.addr, f"{exc.reason}; use 'txbroker topic update'") from None

    outcome, addrs = run(main)
    if cluster is None:
        click.echo(f"topic {name} created with {queues} queue(s)")
        return
    for broker, result in outcome.items():
        click.echo(f"broker {broker} at {addrs.get(broker, '?')}: "
                   + (f"created with {queues} queue(s)" if result == "created" else "exists, unchanged"))
    created = sum(r == "created" for r in outcome.values())
    click.echo(f"topic {name} created on {created} of {len(outcome)} master(s) of cluster {cluster}")


@topic.command()
@click.argument("name")
@click.option("--queues", type=click.IntRange(1, 1024),
              help="New read and write queue count (default: unchanged).")
@click.option("--perm", type=click.Choice(list(PERMS)),
              help="New permission: rw (read and write), r- (read only), -w (write only) "
                   "(default: unchanged).")
@click.option("--force", is_flag=True,
              help="Shrink even if the dropped queues hold messages (consumers stop seeing them).")
@namesrv_option
@credentials_options
def update(name: str, queues: int | None, perm: str | None, force: bool, namesrv: str,
           credentials: dict[str, str]) -> None:
    """Change the queue count or permission of existing topic NAME.

    Shrinking a topic whose dropped queues hold messages is refused unless --force.
    """
    if queues is None and perm is None:
        raise click.UsageError("nothing to change: give --queues and/or --perm")

    async def main() -> dict[str, dict]:
        async with AdminClient(namesrv, **credentials) as admin:
            try:
                return await admin.update_topic(name, queues, None if perm is None else PERMS[perm],
                                                force=force)
            except TopicShrinkError as exc:
                raise CommandError("topic update", exc.addr, f"{exc.reason}; use --force to shrink anyway") from None

    cfg = next(iter(run(main).values()), {})
    click.echo(f"topic {name} updated: {cfg.get('readQueueNums')} queue(s), "
               f"perm {perm_text(int(cfg.get('perm', 0)))}")


@topic.command()
@click.argument("name")
@namesrv_option
@credentials_options
def delete(name: str, namesrv: str, credentials: dict[str, str]) -> None:
    """Delete topic NAME: its config, queues and consumer offsets (system topics refuse)."""

    async def main() -> None:
        async with AdminClient(namesrv, **credentials) as admin:
            await admin.delete_topic(name)

    run(main)
    click.echo(f"topic {name} deleted")


@topic.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print topic configs as JSON.")
@click.option("--system", is_flag=True, help="Include system topics (RMQ_SYS_*, %RETRY%, ...).")
@namesrv_option
@credentials_options
def list_(as_json: bool, system: bool, namesrv: str, credentials: dict[str, str]) -> None:
    """List topics with their queue counts."""

    async def main() -> dict[str, dict]:
        async with AdminClient(namesrv, **credentials) as admin:
            return await admin.list_topics()

    topics = {name: cfg for name, cfg in run(main).items() if system or not is_system_topic(name)}
    if as_json:
        click.echo(orjson.dumps(topics).decode())
        return
    table = Table(title=f"{len(topics)} topic(s)")
    for col in ("topic", "read queues", "write queues", "perm"):
        table.add_column(col)
    for name, cfg in topics.items():
        table.add_row(name, str(cfg.get("readQueueNums", "")), str(cfg.get("writeQueueNums", "")),
                      perm_text(int(cfg.get("perm", 0))))
    Console(width=160).print(table)
