"""``txbroker namesrv``: run a standalone name server in the foreground until SIGINT/SIGTERM.

Brokers started with ``--namesrv-addr`` register with it (with every name server of their
list); clients take the same list.  Once listening, exactly one line
``txbroker namesrv ready addr=HOST:PORT`` goes to stdout (scripts and tests wait for it); logs
go to stderr.  A port in use is one ``error:`` line naming the address, exit 1; a bad option
value (a cluster secret too short, a TLS certificate or key that cannot be loaded: ``--tls-mode``,
the broker's TLS options) is one naming it, exit 2.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys

import click

from txbroker.cli.common import (
    check_setting_variables,
    server_tls_options,
    warn_exposure,
)
from txbroker.remoting.tls import ServerTLS
from txbroker.service.exposure import Listener


@click.command("namesrv")
@click.option("--listen-host", default="127.0.0.1", show_default=True, metavar="HOST",
              help="interface to listen on (0.0.0.0 = every IPv4 interface)")
@click.option("--port", default=9876, show_default=True, type=click.IntRange(0, 65535),
              metavar="PORT", help="name-server port (0 = ephemeral)")
@click.option("--broker-expiry", default=120.0, show_default=True,
              type=click.FloatRange(0, min_open=True), metavar="SECONDS",
              help="a broker that has not registered for this long is dropped, with its routes")
@click.option("--cluster-secret", envvar="TXBROKER_CLUSTER_SECRET", default=None, metavar="SECRET",
              help="the brokers' --cluster-secret: their registrations must be signed with it "
                   "(prefer the variable: a command line is visible to every user)  "
                   "[default: unset: any registration is accepted]")
@click.option("--log-level", default="INFO", show_default=True,
              type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
              help="stderr log level")
@server_tls_options
def namesrv(listen_host: str, port: int, broker_expiry: float, cluster_secret: str | None,
            log_level: str, **tls_settings: str | None) -> None:
    """Run a name server: brokers register with it, clients ask it for routes."""
    from txbroker.config import ConfigError, TlsSettings
    from txbroker.remoting.tls import server_tls

    logging.basicConfig(level=log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    check_setting_variables()  # a misspelt TXBROKER_* variable in the shell: said at once
    from txbroker.config import MIN_SECRET_LENGTH
    if cluster_secret is not None and len(cluster_secret) < MIN_SECRET_LENGTH:
        click.echo(f"error: --cluster-secret must be at least {MIN_SECRET_LENGTH} characters",
                   err=True)
        sys.exit(2)
    try:  # before binding: a certificate that cannot be loaded is one line naming the file
        tls = server_tls(TlsSettings(**tls_settings))  # type: ignore[arg-type]
    except ConfigError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)
    try:
        import uvloop
        runner = asyncio.Runner(loop_factory=uvloop.new_event_loop)
    except ImportError:
        runner = asyncio.Runner()
    with runner:
        code = runner.run(_run(listen_host, port, broker_expiry, cluster_secret, tls))
    sys.exit(code)


async def _run(listen_host: str, port: int, broker_expiry: float, cluster_secret: str | None,
               tls: ServerTLS | None) -> int:
    from txbroker.broker import ListenError
    from txbroker.namesrv import NameServerProcess

    server = NameServerProcess(listen_host=listen_host, port=port, broker_expiry=broker_expiry,
                               cluster_secret=cluster_secret, tls=tls)
    try:
        await server.start()
    except ListenError as exc:  # names the address
        click.echo(f"error: {exc}", err=True)
        return 1
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    # Registrations need the cluster secret when one is set; permissive TLS takes plaintext.
    warn_exposure(listen_host, [Listener(server.port, "name server",
                                         tls is not None and tls.enforcing,
                                         cluster_secret is not None)])
    click.echo(f"txbroker namesrv ready addr={server.addr}")
    sys.stdout.flush()
    await stop.wait()
    await server.stop()
    return 0
