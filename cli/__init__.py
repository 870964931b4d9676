"""The ``txbroker`` command line."""
