"""The ``txbroker`` command group; each sub-command lives in a module named after it."""

from __future__ import annotations

import click

from txbroker import __version__
from txbroker._compiled import in_use
from txbroker.cli.common import OneLineErrors


@click.group(cls=OneLineErrors, context_settings={"help_option_names": ["-h", "--help"]})
# The hot path named: compiled, or pure Python (not built, or switched off).
@click.version_option(__version__, prog_name="txbroker",
                      message=f"%(prog)s, version %(version)s (hot path: {in_use()})")
def main() -> None:
    """txbroker: a transactional message broker speaking the RocketMQ 4.x protocol."""


from txbroker.cli import serve as _serve

main.add_command(_serve.serve)

from txbroker.cli import namesrv as _namesrv

main.add_command(_namesrv.namesrv)

from txbroker.cli import controller as _controller

main.add_command(_controller.controller)

from txbroker.cli import etcd as _etcd

main.add_command(_etcd.etcd)

from txbroker.cli import etcd_import as _etcd_import

main.add_command(_etcd_import.etcd_import)

from txbroker.cli import switchover as _switchover

main.add_command(_switchover.switchover)

from txbroker.cli import consume as _consume
from txbroker.cli import produce as _produce
from txbroker.cli import status as _status
from txbroker.cli import topic as _topic
from txbroker.cli import txn as _txn

main.add_command(_produce.produce)
main.add_command(_consume.consume)
main.add_command(_txn.txn)
main.add_command(_status.status)
main.add_command(_topic.topic)

from txbroker.cli import bench as _bench

main.add_command(_bench.bench)

from txbroker.cli import user as _user

main.add_command(_user.user)

from txbroker.cli import acl as _acl

main.add_command(_acl.acl)
