"""txbroker: a transactional message broker on asyncio, wire-compatible with RocketMQ 4.x."""

from txbroker import _compiled

_compiled.install()

__version__ = "0.1.0"
