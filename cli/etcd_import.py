"""``txbroker etcd-import``: a controller's groups into etcd, once, before moving a cluster to
etcd mode (docs/cluster.md, "Consensus on etcd", :mod:`txbroker.cluster.upgrade`).

Stop the brokers and the controller, run this with the controller's data directory and the
etcd endpoints, then start the brokers with ``--etcd-endpoints`` instead of
``--controller-addr``.  One line per group (imported, or already in etcd); a missing or
malformed ``controller.json`` or an etcd that does not answer is one ``error:`` line, exit 1.
"""

from __future__ import annotations

import asyncio
import sys

import click


@click.command("etcd-import")
@click.option("--controller-data", required=True, metavar="DIR",
              help="the controller's --data-dir (its controller.json)")
@click.option("--etcd-endpoints", envvar="TXBROKER_ETCD_ENDPOINTS", required=True, metavar="ADDRS",
              help="etcd members, 'h:p;h:p' (as the brokers' --etcd-endpoints)")
@click.option("--etcd-prefix", envvar="TXBROKER_ETCD_PREFIX", default="/txbroker",
              show_default=True, metavar="KEY", help="as the brokers' --etcd-prefix")
def etcd_import(controller_data: str, etcd_endpoints: str, etcd_prefix: str) -> None:
    """Import a controller's groups (epochs, in-sync sets) into etcd."""
    from txbroker.cluster.etcd import Etcd, EtcdError, parse_endpoints
    from txbroker.cluster.upgrade import (
        STATE_FILE,
        import_groups,
        read_controller_state,
    )

    try:
        doc = read_controller_state(controller_data)
        endpoints = parse_endpoints(etcd_endpoints)
    except FileNotFoundError:
        click.echo(f"error: no {STATE_FILE} in {controller_data}", err=True)
        sys.exit(1)
    except ValueError as exc:
        click.echo(f"error: {controller_data}/{STATE_FILE} or --etcd-endpoints: {exc}", err=True)
        sys.exit(1)

    async def run() -> list[str]:
        etcd = Etcd(endpoints, timeout=3.0)
        try:
            return await import_groups(etcd, etcd_prefix, doc)
        finally:
            await etcd.close()
    try:
        lines = asyncio.run(run())
    except EtcdError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(1)
    for line in lines:
        click.echo(line)
