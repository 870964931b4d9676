"""``txbroker switchover``: hand a broker group's mastership to a named in-sync replica
(etcd mode; :mod:`txbroker.cluster.switchover`, docs/cluster.md "Consensus on etcd").

The master fences itself before it gives up its leader key, so the old and the new master
never take writes at once.  Prints ``group NAME: master is now id N, epoch E``; a target
outside the in-sync set, not alive, or not elected in time is one ``error:`` line, exit 1.
"""

from __future__ import annotations

import asyncio
import sys

import click


@click.command("switchover")
@click.option("--broker-name", required=True, metavar="NAME", help="the broker group")
@click.option("--to", "target", required=True, type=click.IntRange(0), metavar="ID",
              help="the configured broker id to make master (an in-sync replica)")
@click.option("--cluster-name", default="DefaultCluster", show_default=True, metavar="NAME")
@click.option("--etcd-endpoints", envvar="TXBROKER_ETCD_ENDPOINTS", required=True, metavar="ADDRS",
              help="etcd members, 'h:p;h:p' (as the brokers' --etcd-endpoints)")
@click.option("--etcd-prefix", envvar="TXBROKER_ETCD_PREFIX", default="/txbroker",
              show_default=True, metavar="KEY", help="as the brokers' --etcd-prefix")
@click.option("--timeout", default=20.0, show_default=True, type=click.FloatRange(1),
              metavar="SECONDS", help="how long to wait for the new master")
def switchover(broker_name: str, target: int, cluster_name: str, etcd_endpoints: str,
               etcd_prefix: str, timeout: float) -> None:
    """Make replica --to the master of group --broker-name (etcd mode)."""
    from txbroker.cluster.etcd import Etcd, EtcdError, parse_endpoints
    from txbroker.cluster.leadership import GroupKeys
    from txbroker.cluster.switchover import SwitchoverError, switch_over

    try:
        endpoints = parse_endpoints(etcd_endpoints)
    except ValueError as exc:
        click.echo(f"error: --etcd-endpoints: {exc}", err=True)
        sys.exit(1)
    keys = GroupKeys.named(etcd_prefix, cluster_name, broker_name)

    async def run() -> int:
        etcd = Etcd(endpoints, timeout=3.0)
        try:
            return await switch_over(etcd, keys, target, timeout)
        finally:
            await etcd.close()
    try:
        epoch = asyncio.run(run())
    except (SwitchoverError, EtcdError) as exc:
        click.echo(f"error: group {broker_name}: {exc}", err=True)
        sys.exit(1)
    click.echo(f"group {broker_name}: master is now id {target}, epoch {epoch}")
