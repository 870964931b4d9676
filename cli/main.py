"""The ``txbroker`` command group; each sub-command lives in a module named after it."""

from __future__ import annotations

import click

from txbroker import __version__


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="txbroker")
def main() -> None:
    """txbroker: a transactional message broker speaking the RocketMQ 4.x protocol."""


from cli import serve as _serve

main.add_command(_serve.serve)
