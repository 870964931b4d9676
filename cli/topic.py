"""``txbroker topic``: create, delete and list topics."""

from __future__ import annotations

import click
import orjson
from rich.console import Console
from rich.table import Table

from cli.common import credentials_options, is_system_topic, namesrv_option, run
from txbroker.client.admin import AdminClient


@click.group()
def topic() -> None:
    """Create, delete and list topics."""


@topic.command()
@click.argument("name")
@click.option("--queues", default=4, show_default=True, type=click.IntRange(1, 1024),
              help="Read and write queues.")
@namesrv_option
@credentials_options
def create(name: str, queues: int, namesrv: str, credentials: dict[str, str]) -> None:
    """Create topic NAME (or change its queue count)."""

    async def main() -> None:
        async with AdminClient(namesrv, **credentials) as admin:
            await admin.create_topic(name, queues)

    run(main)
    click.echo(f"topic {name} created with {queues} queue(s)")


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
                      str(cfg.get("perm", "")))
    Console(width=160).print(table)
