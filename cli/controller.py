"""``txbroker controller``: run the controller (docs/cluster.md "Controller and failover") in the
foreground until SIGINT/SIGTERM.

Once it listens, exactly one line ``txbroker controller ready addr=HOST:PORT`` goes to stdout
(scripts wait for it); logs go to stderr.  A port in use, a data directory held by another
controller or an unreadable state file is one ``error:`` line naming the address or the file,
exit 1; a bad option value, or a TLS certificate or key that cannot be loaded, exits 2.
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
from txbroker.remoting.server import new_event_loop
from txbroker.service.exposure import Listener


@click.command("controller")
@click.option("--listen-host", default="127.0.0.1", show_default=True, metavar="HOST",
              help="interface to listen on")
@click.option("--port", default=9878, show_default=True, type=click.IntRange(0, 65535),
              metavar="PORT", help="controller port (0 = ephemeral)")
@click.option("--data-dir", default="./txbroker-controller", show_default=True, metavar="PATH",
              help="where the controller keeps its state (controller.json); one controller "
                   "per directory")
@click.option("--lease", default=3.0, show_default=True, type=click.FloatRange(min=0, min_open=True),
              metavar="SECONDS", help="a master silent for this long is replaced by an in-sync "
                                      "slave; brokers must use the same --controller-lease")
@click.option("--cluster-secret", envvar="TXBROKER_CLUSTER_SECRET", default=None, metavar="SECRET",
              help="the brokers' --cluster-secret: their requests must be signed with it and "
                   "role-change notices are signed with it (prefer the variable: a command "
                   "line is visible to every user)  [default: unset: brokers are trusted]")
@click.option("--log-level", default="INFO", show_default=True,
              type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
              help="stderr log level")
@server_tls_options
def controller(listen_host: str, port: int, data_dir: str, lease: float,
               cluster_secret: str | None, log_level: str, **tls_settings: str | None) -> None:
    """Run the controller that elects each broker group's master (controller mode)."""
    from txbroker.controller import ControllerConfig

    logging.basicConfig(level=log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    check_setting_variables()  # a misspelt TXBROKER_* variable in the shell: said at once
    try:
        config = ControllerConfig(listen_host=listen_host, port=port, data_dir=data_dir,
                                  lease=lease, cluster_secret=cluster_secret,
                                  **tls_settings)  # type: ignore[arg-type]
    except ValueError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        code = runner.run(_run(config))
    sys.exit(code)


async def _run(config) -> int:
    from txbroker.broker import ListenError
    from txbroker.config import ConfigError
    from txbroker.controller import ControllerProcess, ControllerStateError
    from txbroker.store.lock import DataDirInUseError

    try:  # a TLS certificate or key that cannot be loaded: one line naming the file
        process = ControllerProcess(config)
    except ConfigError as exc:
        click.echo(f"error: {exc}", err=True)
        return 2
    try:
        await process.start()
    except ListenError as exc:
        click.echo(f"error: {exc}", err=True)
        return 1
    except DataDirInUseError as exc:
        holder = f"pid {exc.pid}" if exc.pid is not None else "pid unknown"
        click.echo(f"error: controller data directory {exc.directory} is in use ({holder}); "
                   f"stop it or use another --data-dir", err=True)
        return 1
    except (ControllerStateError, OSError) as exc:
        click.echo(f"error: cannot start controller: {exc}", err=True)
        return 1
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    warn_exposure(config.listen_host, [Listener(process.port, "controller",
                                                 config.tls_mode == "enforcing",
                                                 config.cluster_secret is not None)])
    click.echo(f"txbroker controller ready addr={process.addr}")
    sys.stdout.flush()
    await stop.wait()
    await process.stop()
    return 0
