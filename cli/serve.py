"""``txbroker serve``: run a broker in the foreground until SIGINT/SIGTERM.

Every :class:`~txbroker.config.BrokerConfig` field has an option of the same name
(``broker_port`` → ``--broker-port``); values are handed to :func:`~txbroker.config.load_config`
as text so that options, ``TXBROKER_*`` variables and the ``--config`` TOML file share one
validation and one error format.  An invalid value prints one ``error:`` line and exits 2.

Once both ports listen, exactly one line ``txbroker ready broker=HOST:PORT namesrv=HOST:PORT``
goes to stdout (tests and scripts wait for it); logs go to stderr.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from dataclasses import fields

import click

from txbroker.config import BrokerConfig, ConfigError, load_config

log = logging.getLogger("txbroker.serve")

_HELP = {
    "listen_host": "interface to listen on",
    "broker_port": "broker port (0 = ephemeral)",
    "namesrv_port": "embedded name-server port (0 = ephemeral, -1 = off; the broker port answers too)",
    "advertised_host": "host announced in routes and message ids",
    "metrics_port": "Prometheus endpoint port on 127.0.0.1 (-1 = off)",
    "data_dir": "directory for commitlog, queues, offsets and topics",
    "flush_mode": "async (interval flush) or sync (ack after fsync, group commit)",
    "transaction_check_interval": "seconds between transaction check passes",
    "transaction_timeout": "seconds before a half message is first checked",
    "transaction_check_max": "checks before a half message is discarded",
    "acl_file": "RocketMQ plain_acl.yml: turns access control on (unset = off)",
}


def _config_options(fn):
    for f in reversed(fields(BrokerConfig)):
        kind = str(f.type)
        opt = "--" + f.name.replace("_", "-")
        default = f.default
        help_text = _HELP.get(f.name, f.name.replace("_", " "))
        if kind == "bool":
            fn = click.option(f"{opt}/--no-{opt[2:]}", f.name, default=None,
                              help=f"{help_text} [default: {default}]")(fn)
        else:
            fn = click.option(opt, f.name, type=str, default=None, metavar="VALUE",
                              help=f"{help_text} [default: {default}]")(fn)
    return fn


@click.command("serve")
@click.option("--config", "config_file", type=click.Path(dir_okay=False), default=None,
              help="TOML file with settings (top level or a [broker] table)")
@click.option("--log-level", default="INFO", show_default=True,
              type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False))
@_config_options
def serve(config_file: str | None, log_level: str, **options: object) -> None:
    """Run a txbroker broker (with its embedded name server) until SIGINT/SIGTERM."""
    logging.basicConfig(level=log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = load_config(options, os.environ, config_file)
    except ConfigError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)
    for key, value in config.as_dict().items():
        log.info("config %s = %r", key, value)
    try:
        import uvloop
        runner = asyncio.Runner(loop_factory=uvloop.new_event_loop)
    except ImportError:
        runner = asyncio.Runner()
    with runner:
        code = runner.run(_run(config))
    sys.exit(code)


async def _run(config: BrokerConfig) -> int:
    from txbroker.broker import Broker

    broker = Broker(config)
    try:
        await broker.start()
    except ConfigError as exc:  # an invalid ACL file: a setting's fault, like a bad option
        click.echo(f"error: {exc}", err=True)
        return 2
    except OSError as exc:
        click.echo(f"error: cannot start broker: {exc}", err=True)
        await broker.stop()
        return 1
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    click.echo(f"txbroker ready broker={broker.broker_addr} namesrv={broker.namesrv_addr}")
    sys.stdout.flush()
    await stop.wait()
    log.info("shutting down (grace %.1fs)", config.shutdown_grace)
    await broker.stop()
    return 0
