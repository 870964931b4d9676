"""``python -m txbroker``: the ``txbroker`` command, for a subprocess started with the very
interpreter that runs its parent (``python -P -m txbroker serve …``), found through the
installed package and never through a folder of the current directory."""

from txbroker.cli.main import main

main(prog_name="txbroker")
