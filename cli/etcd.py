"""``txbroker etcd``: a three-member etcd on loopback, in the foreground until SIGINT/SIGTERM.

For trying etcd mode on one machine (the README's "Running a cluster"): each member is a
real etcd process with its own data directory under ``--data-dir`` and its own ports, so one
member can be killed and started again (the same command brings back the members that are
not running).  Once every member is healthy, exactly one line
``txbroker etcd ready endpoints=H:P;H:P;H:P`` goes to stdout; the brokers take that list as
``--etcd-endpoints``.  With ``--tls-mode enforcing`` (or ``TXBROKER_TLS_MODE``, as the
brokers take it) the members serve TLS with ``--tls-cert``/``--tls-key`` and require a client
certificate from ``--tls-ca`` (the ``TXBROKER_TLS_*`` variables), which is what brokers dialling
their peers with TLS present.  A production cluster runs etcd on machines of its own
(docs/cluster.md, "Consensus on etcd").  No etcd binary, or a member that does not start, is
one ``error:`` line naming what to do or the member's log, exit 1.
"""

from __future__ import annotations

import signal
import sys
import threading
from pathlib import Path

import click


def _ports(text: str) -> list[int]:
    try:
        ports = [int(p) for p in text.split(",") if p.strip()]
    except ValueError:
        raise click.BadParameter(f"{text!r}: comma-separated port numbers") from None
    if len(ports) != 3 or not all(0 < p < 65536 for p in ports) or len(set(ports)) != 3:
        raise click.BadParameter(f"{text!r}: three different port numbers")
    return ports


@click.command("etcd")
@click.option("--data-dir", default="txbroker-etcd", show_default=True, metavar="DIR",
              help="one directory per member (etcd0, etcd1, etcd2) and its log beside it")
@click.option("--client-ports", default="2379,22379,32379", show_default=True, metavar="P,P,P",
              help="the members' client ports on 127.0.0.1 (their peer ports are free ones)")
@click.option("--tls-mode", envvar="TXBROKER_TLS_MODE", default="off", show_default=True,
              type=click.Choice(["off", "permissive", "enforcing"]),
              help="enforcing: the members serve only TLS and require client certificates "
                   "(permissive counts as off: etcd has no plaintext-and-TLS port)")
@click.option("--tls-cert", envvar="TXBROKER_TLS_CERT", default=None, metavar="PATH",
              help="PEM certificate the members serve")
@click.option("--tls-key", envvar="TXBROKER_TLS_KEY", default=None, metavar="PATH",
              help="PEM key of --tls-cert")
@click.option("--tls-ca", envvar="TXBROKER_TLS_CA", default=None, metavar="PATH",
              help="PEM CA that client certificates must come from")
def etcd(data_dir: str, client_ports: str, tls_mode: str, tls_cert: str | None,
         tls_key: str | None, tls_ca: str | None) -> None:
    """Run a three-member etcd on 127.0.0.1 for etcd mode."""
    from txbroker.cluster.local_etcd import EtcdNotFound, EtcdServerTLS, LocalEtcd

    tls = None
    if tls_mode == "enforcing":
        if not (tls_cert and tls_key and tls_ca):
            click.echo("error: --tls-mode enforcing needs --tls-cert, --tls-key and --tls-ca "
                       "(or TXBROKER_TLS_CERT, _KEY, _CA)", err=True)
            sys.exit(2)
        tls = EtcdServerTLS(tls_ca, tls_cert, tls_key)
    cluster = LocalEtcd(Path(data_dir), client_ports=_ports(client_ports), tls=tls)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        cluster.start()
    except (EtcdNotFound, RuntimeError, TimeoutError) as exc:
        cluster.stop()
        click.echo(f"error: {exc}", err=True)
        sys.exit(1)
    click.echo(f"txbroker etcd ready endpoints={cluster.endpoints}")
    sys.stdout.flush()
    try:
        while not stop.wait(1.0):
            for m in cluster.members:
                if m.process is not None and m.process.poll() is not None:
                    click.echo(f"etcd member {m.name} ({m.endpoint}) exited with "
                               f"{m.process.returncode}", err=True)
                    m.process = None
    finally:
        cluster.stop()
